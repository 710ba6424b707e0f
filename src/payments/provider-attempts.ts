import { Inject, Injectable } from '@nestjs/common';
import type { AppConfig } from '../config/app-config.js';
import { APP_CONFIG } from '../config/config.module.js';
import { AtomicPhases, Database, type LeasedKey } from '@idempotent-orders/idempotency';

/** The two tables whose rows are sent to the provider: a payment is a charge, a refund a refund. */
export type AttemptTable = 'payments' | 'refunds';

const SUBJECT = { payments: 'payment', refunds: 'refund' } as const;

/**
 * The bound on a row's last attempt: its provider_attempts row, or — for a row written by a version before that
 * table — created_at + 1 hour, since that version sent only within the lease that wrote the row, and no lease is
 * longer than an hour. `s` is the payment or refund, `a` its provider_attempts row (LEFT JOIN).
 */
const LAST_ATTEMPT_BY = `coalesce(a.last_attempt_by, s.created_at + interval '1 hour')`;

/**
 * A payment or refund sent to the provider was first failed as never reached this long ago: asked about again
 * this long after (then at doubling intervals, see PaymentReconciler.sweepUnreached). Sooner than a minute would
 * mostly repeat the decision's own lookups.
 */
export const FIRST_RECHECK_SECONDS = 60;

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
   * Step ② of a new payment or refund, in its transaction: the holder that inserted `id` under key `keyId` calls
   * out only before its lease ends.
   */
  async firstAttempt(table: AttemptTable, id: string, keyId: string): Promise<void> {
    await this.db.query(
      `INSERT INTO provider_attempts (subject_id, subject, last_attempt_by) SELECT $1, $3, locked_until FROM idempotency_keys WHERE id = $2`,
      [id, keyId, SUBJECT[table]],
    );
  }

  /**
   * A resumed holder is about to send again: no attempt of it can be sent after its lease ends. Under the key's
   * row lock, taken first (the lock order) and only while this holder still holds it: false when it has lost the
   * key (then it must not send).
   */
  resending(table: AttemptTable, id: string, key: LeasedKey): Promise<boolean> {
    return this.db.transaction(async () => {
      if (!(await this.holds(key))) return false;
      await this.db.query(
        `INSERT INTO provider_attempts (subject_id, subject, last_attempt_by)
         SELECT s.id, $3, greatest(${LAST_ATTEMPT_BY}, k.locked_until)
           FROM ${table} s LEFT JOIN provider_attempts a ON a.subject_id = s.id, idempotency_keys k
          WHERE s.id = $1 AND k.id = $2
         ON CONFLICT (subject_id) DO UPDATE SET last_attempt_by = greatest(provider_attempts.last_attempt_by, excluded.last_attempt_by)`,
        [id, key.id, SUBJECT[table]],
      );
      return true;
    });
  }

  /**
   * The holder's attempts are over and their outcome unknown: the bound comes down to now (every attempt was
   * sent before this), then the lease is given back — in one transaction under the key's row lock, so no new
   * holder can raise the bound for its own attempts in between and see it lowered after.
   */
  gaveUp(id: string, key: LeasedKey): Promise<void> {
    return this.db.transaction(async () => {
      if (!(await this.holds(key))) return;
      await this.db.query(
        `UPDATE provider_attempts SET last_attempt_by = least(last_attempt_by, clock_timestamp()) WHERE subject_id = $1`,
        [id],
      );
      await this.phases.release(key);
    });
  }

  /** How long (ms, on the database's clock) an attempt of this row may still reach the provider; 0 when none can. */
  async landingWindowLeft(table: AttemptTable, id: string): Promise<number> {
    const [row] = await this.db.query<{ ms_left: number }>(
      `SELECT greatest(0, extract(epoch FROM ${LAST_ATTEMPT_BY} + make_interval(secs => $2) - clock_timestamp()) * 1000)::float8 AS ms_left
         FROM ${table} s LEFT JOIN provider_attempts a ON a.subject_id = s.id WHERE s.id = $1`,
      [id, this.config.pspMaxLatencyMs / 1000],
    );
    return row?.ms_left ?? 0;
  }

  /**
   * Whether a resumed holder may send the row again under its outbound key. Only while the row is younger than
   * PSP_MAX_LATENCY_MS: after that nothing new is sent, so the landing window can close and lookups decide (a
   * client retrying faster than the window against a provider that never answers would otherwise keep it open
   * for ever). And only while even a re-send that lands as late as it may still finds the provider remembering
   * the key (PSP_KEY_RETENTION_HOURS from the first attempt, when the row was created): past that, the same key
   * could make a second charge.
   */
  mayResend(createdAt: Date): boolean {
    const { pspKeyRetentionHours, pspMaxLatencyMs, idempotencyLeaseSeconds } = this.config;
    const created = createdAt.getTime();
    const lastSafeSend = Math.min(
      created + pspMaxLatencyMs,
      created + pspKeyRetentionHours * 3_600_000 - pspMaxLatencyMs - idempotencyLeaseSeconds * 1000,
    );
    return Date.now() < lastSafeSend;
  }

  /**
   * In the settling transaction of a row failed as never reached: the sweep asks the provider about it again
   * from FIRST_RECHECK_SECONDS on.
   */
  async failedUnreached(table: AttemptTable, id: string): Promise<void> {
    await this.db.query(
      `INSERT INTO provider_attempts (subject_id, subject, last_attempt_by, unreached_at, recheck_at)
       VALUES ($1, $2, now(), now(), now() + make_interval(secs => $3))
       ON CONFLICT (subject_id) DO UPDATE SET unreached_at = now(), recheck_at = excluded.recheck_at`,
      [id, SUBJECT[table], FIRST_RECHECK_SECONDS],
    );
  }

  /** In a repairing transaction: the money was found, so the sweep stops asking. */
  async found(id: string): Promise<void> {
    await this.db.query(`UPDATE provider_attempts SET recheck_at = NULL WHERE subject_id = $1 AND recheck_at IS NOT NULL`, [id]);
  }

  /**
   * The sweep's next rows of `table` to ask about, each claimed by moving its recheck_at on (SKIP LOCKED: N
   * instances share them, none asks twice): at doubling intervals since it was failed. `last`: the look that ends
   * PSP_KEY_RETENTION_HOURS; the row leaves the list only once that look is answered (stopRechecking), so a
   * last look that could not be made is made again.
   */
  async dueForRecheck(table: AttemptTable, limit: number): Promise<{ id: string; last: boolean }[]> {
    const rows = await this.db.query<{ subject_id: string; last: boolean }>(
      `WITH due AS (
         SELECT subject_id FROM provider_attempts WHERE subject = $1 AND recheck_at <= now() ORDER BY recheck_at LIMIT $2 FOR UPDATE SKIP LOCKED
       )
       UPDATE provider_attempts a
          SET recheck_at = now() + greatest(now() - a.unreached_at, interval '1 second')
         FROM due WHERE a.subject_id = due.subject_id
       RETURNING a.subject_id, now() - a.unreached_at > make_interval(hours => $3) AS last`,
      [SUBJECT[table], limit, this.config.pspKeyRetentionHours],
    );
    return rows.map((r) => ({ id: r.subject_id, last: r.last }));
  }

  /** The sweep's last look at a row was answered (nothing landed): it stops asking. */
  async stopRechecking(id: string): Promise<void> {
    await this.db.query(`UPDATE provider_attempts SET recheck_at = NULL WHERE subject_id = $1 AND recheck_at IS NOT NULL`, [id]);
  }

  /** Rows the sweep could not ask about (the provider away): asked again after `ms`, sooner than their doubled interval. */
  async recheckAgain(ids: string[], ms: number): Promise<void> {
    await this.db.query(
      `UPDATE provider_attempts SET recheck_at = least(recheck_at, now() + make_interval(secs => $2)) WHERE subject_id = ANY($1::uuid[]) AND recheck_at IS NOT NULL`,
      [ids, ms / 1000],
    );
  }

  /**
   * Puts on the sweep's list the rows of `table` failed as never reached within PSP_KEY_RETENTION_HOURS that are not on
   * it: an older build still serving during a deploy fails them its own way and writes no unreached_at (no row here,
   * or only the one a newer holder's first attempt wrote). Their failure time stands for unreached_at, and the first
   * look is due now. ix_*_unreached (migration 1764415100000) keeps the scan to such rows.
   */
  async adoptUnreached(table: AttemptTable): Promise<void> {
    await this.db.query(
      `INSERT INTO provider_attempts (subject_id, subject, last_attempt_by, unreached_at, recheck_at)
       SELECT s.id, $1, s.updated_at, s.updated_at, now() FROM ${table} s
        WHERE s.status = 'failed' AND s.failure_code = 'provider_unreachable' AND s.updated_at > now() - make_interval(hours => $2)
          AND NOT EXISTS (SELECT 1 FROM provider_attempts a WHERE a.subject_id = s.id AND a.unreached_at IS NOT NULL)
       ON CONFLICT (subject_id) DO UPDATE SET unreached_at = excluded.unreached_at, recheck_at = excluded.recheck_at
        WHERE provider_attempts.unreached_at IS NULL`,
      [SUBJECT[table], this.config.pspKeyRetentionHours],
    );
  }

  /** Locks the key row (the first lock of the lock order) if this holder still holds it. */
  private async holds(key: LeasedKey): Promise<boolean> {
    const rows = await this.db.query(
      `SELECT 1 FROM idempotency_keys WHERE id = $1 AND lease_token = $2 AND state = 'in_progress' FOR UPDATE`,
      [key.id, key.leaseToken],
    );
    return rows.length === 1;
  }
}
