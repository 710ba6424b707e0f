import { Check, Column, Entity, Index, PrimaryColumn } from 'typeorm';

/** When the provider may still act on a payment or refund we sent it (migration 1764415000000 says why each column is there). */
@Entity('provider_attempts')
@Index('ix_provider_attempts_recheck', ['recheckAt'], { where: `"recheck_at" IS NOT NULL` })
@Check('ck_provider_attempts_subject', `"subject" IN ('payment', 'refund')`)
@Check('ck_provider_attempts_recheck', `"recheck_at" IS NULL OR "unreached_at" IS NOT NULL`)
export class ProviderAttempt {
  /** The payment's or refund's id. */
  @PrimaryColumn({ name: 'subject_id', type: 'uuid', primaryKeyConstraintName: 'pk_provider_attempts' })
  subjectId: string;

  @Column({ type: 'text' })
  subject: 'payment' | 'refund';

  @Column({ name: 'last_attempt_by', type: 'timestamptz' })
  lastAttemptBy: Date;

  @Column({ name: 'unreached_at', type: 'timestamptz', nullable: true })
  unreachedAt: Date | null;

  @Column({ name: 'recheck_at', type: 'timestamptz', nullable: true })
  recheckAt: Date | null;
}
