import { Inject, Injectable } from '@nestjs/common';
import type { AppConfig } from '../config/app-config.js';
import { APP_CONFIG } from '../config/config.module.js';
import { Database } from '../database/database.service.js';
import { AtomicPhases, type LeasedKey } from '../idempotency/atomic-phases.js';

/** The two tables whose rows are sent to the provider: a payment is a charge, a refund a refund. */
export type AttemptTable = 'payments' | 'refunds';

/**
 * The bound a row's `last_attempt_by` stands for when it is NULL (written by a version that did not know the
 * column): that version sent within the lease that wrote the row, and no lease is longer than an hour.
 */
const lastAttemptBy = (table: string) => `coalesce(${table}.last_attempt_by, ${table}.created_at + interval '1 hour')`;

/**
 * When the provider may still act on what we sent it. A request can reach the provider long after we gave
 * up on it (a queue in a load balancer, a retrying proxy), so every holder records, before it calls out, a
 * bound on its last attempt (`last_attempt_by`: its lease's end); until that bound plus PSP_MAX_LATENCY_MS
 * has passed, nobody may conclude from lookups that the provider never saw the payment (refund).
 * Re-sending under the same outbound key decides sooner — the provider dedupes it — but only while the
 * provider still remembers the key (PSP_KEY_RETENTION_HOURS from the first attempt).
 */
@Injectable()
export class ProviderAttempts {
  constructor(
    private readonly db: Database,
    private readonly phases: AtomicPhases,
    @Inject(APP_CONFIG) private readonly config: AppConfig,
  ) {}

  /**
   * A resumed holder is about to send again: no attempt of it can be sent after its lease ends. Fenced by its
   * lease token; false when it has lost the key (then it must not send).
   */
  async resending(table: AttemptTable, id: string, key: LeasedKey): Promise<boolean> {
    const rows = await this.db.query(
      `UPDATE ${table} t SET last_attempt_by = greatest(${lastAttemptBy('t')}, k.locked_until)
         FROM idempotency_keys k
        WHERE t.id = $1 AND k.id = $2 AND k.lease_token = $3
       RETURNING t.id`,
      [id, key.id, key.leaseToken],
    );
    return rows.length === 1;
  }

  /** The row a resumed key is for. */
  async ofKey(table: AttemptTable, keyId: string): Promise<string | undefined> {
    const [row] = await this.db.query<{ id: string }>(`SELECT id FROM ${table} WHERE idempotency_key_id = $1`, [keyId]);
    return row?.id;
  }

  /**
   * The holder's attempts are over and their outcome unknown: the bound comes down to now (every attempt
   * was sent before this), then the lease is given back. Fenced by the lease token, and in that order: once
   * released, a new holder may raise the bound for its own attempts, and this must not lower it.
   */
  async gaveUp(table: AttemptTable, id: string, key: LeasedKey): Promise<void> {
    await this.db.query(
      `UPDATE ${table} SET last_attempt_by = least(${lastAttemptBy(table)}, clock_timestamp())
        WHERE id = $1 AND EXISTS (SELECT 1 FROM idempotency_keys WHERE id = $2 AND lease_token = $3)`,
      [id, key.id, key.leaseToken],
    );
    await this.phases.release(key);
  }

  /** How long (ms, on the database's clock) an attempt of this row may still reach the provider; 0 when none can. */
  async landingWindowLeft(table: AttemptTable, id: string): Promise<number> {
    const [row] = await this.db.query<{ ms_left: number }>(
      `SELECT greatest(0, extract(epoch FROM ${lastAttemptBy(table)} + make_interval(secs => $2) - clock_timestamp()) * 1000)::float8 AS ms_left
         FROM ${table} WHERE id = $1`,
      [id, this.config.pspMaxLatencyMs / 1000],
    );
    return row?.ms_left ?? 0;
  }

  /**
   * Whether a resumed holder may send the row again under its outbound key. Only while the row is younger than
   * PSP_MAX_LATENCY_MS: after that nothing new is sent, so the landing window can close and lookups decide (a
   * client retrying faster than the window against a provider that never answers would otherwise keep it open
   * for ever). And only while the provider remembers the key — counted from the first attempt, when the row was
   * created, with a lease to spare — since past that the same key could make a second charge.
   */
  mayResend(createdAt: Date): boolean {
    const forgetsAt = createdAt.getTime() + this.config.pspKeyRetentionHours * 3_600_000 - this.config.idempotencyLeaseSeconds * 1000;
    return Date.now() < Math.min(forgetsAt, createdAt.getTime() + this.config.pspMaxLatencyMs);
  }
}
