import { Check, Column, Entity, Index, PrimaryGeneratedColumn, Unique } from 'typeorm';

export type IdempotencyKeyState = 'in_progress' | 'completed';

/**
 * One row per (client, Idempotency-Key): the response to replay. For handlers that write only to
 * PostgreSQL the key's lock is taken, the handler writes, and the row is written once, completed,
 * in one transaction, so no one ever sees it unfinished.
 * `recovery_point` and `locked_until` serve handlers with external side effects (AtomicPhases), which
 * commit between phases and resume from the last recovery point under a lease.
 */
@Entity('idempotency_keys')
@Unique('uq_idempotency_keys_client_key', ['clientId', 'key'])
@Index('ix_idempotency_keys_expires_at', ['expiresAt'])
@Index('ix_idempotency_keys_unfinished_lease', ['lockedUntil'], { where: `"locked_until" IS NOT NULL` })
@Check('ck_idempotency_keys_state', `"state" IN ('in_progress', 'completed')`)
@Check('ck_idempotency_keys_key_length', `char_length("key") BETWEEN 1 AND 255`)
@Check(
  'ck_idempotency_keys_completed_has_response',
  `"state" <> 'completed' OR ("response_status" IS NOT NULL AND "response_body" IS NOT NULL AND "completed_at" IS NOT NULL)`,
)
@Check('ck_idempotency_keys_sealed_answer', `"response_sealed" IS NULL OR ("state" = 'completed' AND "response_key_id" IS NOT NULL)`)
export class IdempotencyKey {
  @PrimaryGeneratedColumn('uuid', { primaryKeyConstraintName: 'pk_idempotency_keys' })
  id: string;

  @Column({ name: 'client_id', type: 'text' })
  clientId: string;

  @Column({ type: 'text' })
  key: string;

  /** sha256 of method, path and canonical JSON body: the request the key is bound to. */
  @Column({ type: 'text' })
  fingerprint: string;

  @Column({ name: 'request_method', type: 'text' })
  requestMethod: string;

  @Column({ name: 'request_path', type: 'text' })
  requestPath: string;

  @Column({ type: 'text', default: 'in_progress' })
  state: IdempotencyKeyState;

  @Column({ name: 'recovery_point', type: 'text', default: 'started' })
  recoveryPoint: string;

  @Column({ name: 'locked_until', type: 'timestamptz', nullable: true })
  lockedUntil: Date | null;

  /** Who holds the lease of a phased key: every write of a holder is fenced by it (see AtomicPhases). */
  @Column({ name: 'lease_token', type: 'uuid', nullable: true })
  leaseToken: string | null;

  @Column({ name: 'response_status', type: 'integer', nullable: true })
  responseStatus: number | null;

  @Column({ name: 'response_headers', type: 'jsonb', nullable: true })
  responseHeaders: Record<string, string> | null;

  /** The exact bytes sent the first time (JSON text), replayed as they are. */
  @Column({ name: 'response_body', type: 'text', nullable: true })
  responseBody: string | null;

  /** The key id that sealed `responseSealed` (responseEncryption); null when the answer is stored in plain. */
  @Column({ name: 'response_key_id', type: 'text', nullable: true })
  responseKeyId: string | null;

  /** The answer sealed with AES-256-GCM (StoredResponseCipher); when set, the plain response columns hold a placeholder. */
  @Column({ name: 'response_sealed', type: 'bytea', nullable: true })
  responseSealed: Buffer | null;

  @Column({ name: 'created_at', type: 'timestamptz', default: () => 'now()' })
  createdAt: Date;

  @Column({ name: 'completed_at', type: 'timestamptz', nullable: true })
  completedAt: Date | null;

  @Column({ name: 'expires_at', type: 'timestamptz' })
  expiresAt: Date;
}
