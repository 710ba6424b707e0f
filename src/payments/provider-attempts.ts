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
const LAST_ATTEMPT_BY = `coalesce(last_attempt_by, created_at + interval '1 hour')`;

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
   * In the phase-1 transaction of a resumed key, before it calls out again: no attempt of this holder can be
   * sent after its lease ends. The row's id (one statement: it also finds the row the key is for).
   */
  async resuming(table: AttemptTable, keyId: string): Promise<string | undefined> {
    const [row] = await this.db.query<{ id: string }>(
      `UPDATE ${table} SET last_attempt_by = greatest(${LAST_ATTEMPT_BY}, (SELECT locked_until FROM idempotency_keys WHERE id = $1))
        WHERE idempotency_key_id = $1
       RETURNING id`,
      [keyId],
    );
    return row?.id;
  }

  /**
   * The holder's attempts are over and their outcome unknown: the bound comes down to now (every attempt
   * was sent before this), then the lease is given back. Fenced by the lease token, and in that order: once
   * released, a new holder may raise the bound for its own attempts, and this must not lower it.
   */
  async gaveUp(table: AttemptTable, id: string, key: LeasedKey): Promise<void> {
    await this.db.query(
      `UPDATE ${table} SET last_attempt_by = least(${LAST_ATTEMPT_BY}, clock_timestamp())
        WHERE id = $1 AND EXISTS (SELECT 1 FROM idempotency_keys WHERE id = $2 AND lease_token = $3)`,
      [id, key.id, key.leaseToken],
    );
    await this.phases.release(key);
  }

  /** How long (ms, on the database's clock) an attempt of this row may still reach the provider; 0 when none can. */
  async landingWindowLeft(table: AttemptTable, id: string): Promise<number> {
    const [row] = await this.db.query<{ ms_left: number }>(
      `SELECT greatest(0, extract(epoch FROM ${LAST_ATTEMPT_BY} + make_interval(secs => $2) - clock_timestamp()) * 1000)::float8 AS ms_left
         FROM ${table} WHERE id = $1`,
      [id, this.config.pspMaxLatencyMs / 1000],
    );
    return row?.ms_left ?? 0;
  }

  /**
   * Whether the row may be sent again under its outbound key: the provider dedupes it only while it remembers
   * the key, counted from the first attempt (phase 1, when the row was created), with a lease to spare.
   */
  mayResend(createdAt: Date): boolean {
    const forgetsAt = createdAt.getTime() + this.config.pspKeyRetentionHours * 3_600_000 - this.config.idempotencyLeaseSeconds * 1000;
    return Date.now() < forgetsAt;
  }
}
