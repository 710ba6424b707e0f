import { Check, Column, Entity, Index, PrimaryColumn } from 'typeorm';

export type WebhookEffect = 'applied' | 'no_effect';

/** A provider event this service has processed, and what it did (migration 1764414700000 says what each constraint prevents). */
@Entity('processed_webhook_events')
@Index('ix_processed_webhook_events_received_at', ['receivedAt'])
@Check('ck_processed_webhook_events_outcome', `"outcome" IN ('applied', 'no_effect')`)
export class ProcessedWebhookEvent {
  /** The `webhook-id` header: the same for every delivery of one event. */
  @PrimaryColumn({ name: 'webhook_id', type: 'text', primaryKeyConstraintName: 'pk_processed_webhook_events' })
  webhookId: string;

  /** The event's type as sent; null when the body could not be read. */
  @Column({ type: 'text', nullable: true })
  type: string | null;

  @Column({ type: 'text' })
  outcome: WebhookEffect;

  /** What it did (payment-succeeded, …) or why it did nothing (unknown-payment, already-settled, amount-mismatch, …). */
  @Column({ type: 'text' })
  detail: string;

  @Column({ name: 'payment_id', type: 'uuid', nullable: true })
  paymentId: string | null;

  @Column({ name: 'refund_id', type: 'uuid', nullable: true })
  refundId: string | null;

  @Column({ name: 'received_at', type: 'timestamptz', default: () => 'now()' })
  receivedAt: Date;
}
