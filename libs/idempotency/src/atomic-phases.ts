import { Inject, Injectable, Logger } from '@nestjs/common';
import { Database } from './database.js';
import { IdempotencyMetrics, type IdempotencyOutcome } from './idempotency-metrics.js';
import { IDEMPOTENCY_OPTIONS, type IdempotentRequest, type ResolvedIdempotencyOptions } from './idempotency-options.js';
import { IdempotencyProblems } from './idempotency-problems.js';
import type { KeyScope, StoredResponse } from './idempotency-keys.service.js';
import { monotonicNow } from './monotonic-clock.js';
import { PG, pgErrorCode } from './pg-errors.js';
import type { ProblemDetailsException } from './problem-details.js';
import { answerParams, StoredResponseCipher } from './stored-response-cipher.js';

/**
 * A phased key's lease, as its holder knows it. Every later write of the holder names
 * `leaseToken`: once the lease has run out and someone else took the key over, those writes match
 * no row, so a slow holder can never settle or answer on top of the one that replaced it.
 */
export interface LeasedKey {
  id: string;
  leaseToken: string;
  recoveryPoint: string;
  /** Monotonic ms (monotonicNow) by which this holder must have stopped calling out (the lease end minus a margin). */
  deadline: number;
}

export type Acquired =
  /** The key was finished earlier: replay its answer. */
  | { kind: 'completed'; response: StoredResponse }
  /** New: this request owns the key; its phase 1 runs in the same (still open) transaction. */
  | { kind: 'claimed'; key: LeasedKey }
  /** Unfinished and its lease had run out: this request took it over and resumes at `key.recoveryPoint`. */
  | { kind: 'resumed'; key: LeasedKey };

/**
 * The columns a new lease holder learns. `lease_ms_left` is measured on the database's clock at the
 * moment of the claim (clock_timestamp(), not the transaction's start: a claim that waited on a row
 * lock still gets its full lease), so the holder's deadline can never fall after the lease's end.
 */
const LEASE_COLUMNS = `id, lease_token, recovery_point, (extract(epoch FROM locked_until - clock_timestamp()) * 1000)::float8 AS lease_ms_left`;

interface LeaseRow {
  id: string;
  lease_token: string;
  recovery_point: string;
  lease_ms_left: number;
}

const KEY_COLUMNS = `id, fingerprint, state, recovery_point, lease_token,
  locked_until > clock_timestamp() AS leased, ceil(extract(epoch FROM locked_until - clock_timestamp())) AS lease_seconds_left,
  expires_at <= now() AS expired, response_status, response_headers, response_body, response_key_id, response_sealed`;

interface PhasedKeyRow {
  id: string;
  fingerprint: string;
  state: 'in_progress' | 'completed';
  recovery_point: string;
  lease_token: string | null;
  leased: boolean | null;
  lease_seconds_left: string | null;
  expired: boolean;
  response_status: number | null;
  response_headers: Record<string, string> | null;
  response_body: string | null;
  response_key_id: string | null;
  response_sealed: Buffer | null;
}

/**
 * A new phased key carries its lease from the start. It never expires while unfinished
 * ('infinity'): the reaper must not delete a key whose external call may still be under way; it expires
 * IDEMPOTENCY_TTL_SECONDS after it completes.
 */
const CLAIM_PHASED_KEY = `
  INSERT INTO idempotency_keys (client_id, key, fingerprint, request_method, request_path, expires_at, lease_token, locked_until)
  VALUES ($1, $2, $3, $4, $5, 'infinity', gen_random_uuid(), clock_timestamp() + make_interval(secs => $6))
  ON CONFLICT ON CONSTRAINT uq_idempotency_keys_client_key DO NOTHING
  RETURNING ${LEASE_COLUMNS}`;

/**
 * Takes over an unfinished key whose lease has run out: the one conditional UPDATE a retry and the
 * reconciler both use, so only one of them can hold the key at a time. With $3, also a key that nobody
 * holds but that is set aside until its outcome can be decided (`setAside`): the request's own retry
 * may resume it at once (it may re-send under the same outbound key), while the reconciler waits.
 */
const TAKE_OVER_LEASE = `
  UPDATE idempotency_keys
     SET lease_token = gen_random_uuid(), locked_until = clock_timestamp() + make_interval(secs => $2)
   WHERE id = $1 AND state = 'in_progress'
     AND (locked_until IS NULL OR locked_until <= clock_timestamp() OR ($3 AND lease_token IS NULL))
  RETURNING ${LEASE_COLUMNS}`;

/**
 * What a duplicate of a request still in flight is told to wait, whatever is left of the lease: a
 * phased call usually settles in well under a second, and a retry that comes too soon is answered the same way.
 */
const IN_FLIGHT_RETRY_AFTER_SECONDS = 2;

/** Rounds of `acquire` before a 409: each needs the key's row to vanish between two of its statements, so a few suffice. */
const CLAIM_ROUNDS = 3;
/** `fromExisting`: the row stopped counting (expired and deleted, or taken over first); `acquire` goes round again. */
const CLAIM_AGAIN = Symbol('claim again');

/**
 * brandur's atomic phases ("Implementing Stripe-like Idempotency Keys in Postgres") for handlers
 * with an external side effect, which cannot run inside one transaction with the key:
 *
 *   phase 1 (one transaction): claim the key with a lease, write what is needed to call out, set a recovery point;
 *   phase 2 (no transaction):  call the provider with a key derived from what phase 1 stored;
 *   phase 3 (one transaction): record the outcome and complete the key with the answer.
 *
 * A crash between phases leaves the key unfinished under its lease; when the lease runs out, a
 * retry with the same key (or the reconciler) takes it over and resumes at the recovery point.
 * A duplicate during the lease gets 409 + Retry-After. Everything written by a holder is fenced by
 * its lease token. The interceptor serves the single-transaction handlers; this serves the phased ones.
 */
@Injectable()
export class AtomicPhases {
  private readonly logger = new Logger('Idempotency');

  constructor(
    private readonly db: Database,
    private readonly metrics: IdempotencyMetrics,
    private readonly problems: IdempotencyProblems,
    @Inject(IDEMPOTENCY_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
    private readonly cipher: StoredResponseCipher,
  ) {}

  /** The request's key, scoped to its client and bound to its fingerprint; a missing key is a 400 (nothing runs). */
  scopeOf(req: IdempotentRequest): KeyScope {
    const raw = req.headers['idempotency-key'];
    if (raw === undefined) {
      this.metrics.note('missing', this.options.callerScope(req), undefined);
      throw this.problems.keyMissing();
    }
    return this.problems.scopeOf(req, raw);
  }

  /**
   * Claims, resumes or answers the key. Must run inside a transaction: when it returns `claimed`, the
   * caller's phase 1 writes join that transaction and commit with the claim (or roll it back with
   * them, leaving the key free). Each round: a new row, or else the existing one, locked, decides; a row
   * that stops counting in between (reaped, expired, taken over first) sends it round again.
   */
  async acquire(scope: KeyScope): Promise<Acquired> {
    for (let round = 0; round < CLAIM_ROUNDS; round++) {
      const claimed = await this.claimNew(scope);
      if (claimed) {
        this.note('executed', scope);
        return { kind: 'claimed', key: this.leased(claimed) };
      }
      const existing = await this.lockExisting(scope);
      if (!existing) continue; // reaped meanwhile: claim it afresh
      const acquired = await this.fromExisting(scope, existing);
      if (acquired !== CLAIM_AGAIN) return acquired;
    }
    this.note('conflict', scope);
    throw this.leaseHeld(1);
  }

  /** The key's new row, with a lease, or undefined when a row exists (the INSERT waited for its transaction, so it is committed). */
  private async claimNew(scope: KeyScope): Promise<LeaseRow | undefined> {
    const params = [scope.clientId, scope.key, scope.fingerprint, scope.method, scope.path, this.options.leaseSeconds];
    const [claimed] = await this.lockTimeoutIsConflict(scope, () => this.db.query<LeaseRow>(CLAIM_PHASED_KEY, params));
    return claimed;
  }

  /** The existing row, locked, so that a take-over here and a settler elsewhere cannot interleave; undefined once reaped. */
  private async lockExisting(scope: KeyScope): Promise<PhasedKeyRow | undefined> {
    const [row] = await this.lockTimeoutIsConflict(scope, () =>
      this.db.query<PhasedKeyRow>(`SELECT ${KEY_COLUMNS} FROM idempotency_keys WHERE client_id = $1 AND key = $2 FOR UPDATE`, [
        scope.clientId,
        scope.key,
      ]),
    );
    return row;
  }

  /** What an existing key gives this request: its answer, its lease (taken over), a refusal (thrown), or CLAIM_AGAIN. */
  private async fromExisting(scope: KeyScope, row: PhasedKeyRow): Promise<Acquired | typeof CLAIM_AGAIN> {
    if (row.fingerprint !== scope.fingerprint) {
      this.note('mismatch', scope);
      throw this.problems.keyReused();
    }
    if (row.state === 'completed') {
      if (!row.expired) {
        this.note('replayed', scope);
        return { kind: 'completed', response: this.cipher.responseOf(row) };
      }
      // An expired key counts as absent. A new row (new id), so whatever the old one settled keeps its link to nothing.
      await this.db.query(`DELETE FROM idempotency_keys WHERE id = $1`, [row.id]);
      return CLAIM_AGAIN;
    }
    // A live holder: answer 409. A key only set aside (no holder) is this request's to resume.
    if (row.leased && row.lease_token !== null) {
      this.note('conflict', scope);
      throw this.leaseHeld(Math.min(IN_FLIGHT_RETRY_AFTER_SECONDS, Math.max(1, Number(row.lease_seconds_left ?? 1))));
    }
    const [taken] = await this.db.query<LeaseRow>(TAKE_OVER_LEASE, [row.id, this.options.leaseSeconds, true]);
    if (!taken) return CLAIM_AGAIN;
    this.note('executed', scope);
    this.logger.log(`idempotency resumed: client ${scope.clientId}, key ${scope.key}, at ${taken.recovery_point}`);
    return { kind: 'resumed', key: this.leased(taken) };
  }

  /**
   * Takes the lease of an unfinished key whose lease has run out, for the reconciler. Its own
   * statement (SKIP LOCKED): a key a request is taking over right now is simply not reconciled this round.
   */
  async takeOverExpiredLeases(recoveryPoints: string[], limit: number): Promise<LeasedKey[]> {
    const rows = await this.db.query<LeaseRow>(
      `UPDATE idempotency_keys
          SET lease_token = gen_random_uuid(), locked_until = clock_timestamp() + make_interval(secs => $3)
        WHERE id IN (SELECT id FROM idempotency_keys
                      WHERE state = 'in_progress' AND locked_until <= clock_timestamp() AND recovery_point = ANY($1::text[])
                      ORDER BY locked_until LIMIT $2 FOR UPDATE SKIP LOCKED)
       RETURNING ${LEASE_COLUMNS}`,
      [recoveryPoints, limit, this.options.leaseSeconds],
    );
    return rows.map((r) => this.leased(r));
  }

  /**
   * Takes over one unfinished key whose lease has run out (a stale one found by another request); undefined when it is still leased or
   * finished.
   */
  async takeOverLease(keyId: string): Promise<LeasedKey | undefined> {
    const [taken] = await this.db.query<LeaseRow>(TAKE_OVER_LEASE, [keyId, this.options.leaseSeconds, false]);
    return taken && this.leased(taken);
  }

  /**
   * Gives the lease up without an answer, and keeps the reconciler (and other keys' requests) away for
   * `ms`: the outcome cannot be decided before then (an abandoned attempt may still reach the provider).
   * The request's own retry may still resume it (see TAKE_OVER_LEASE). Fenced like `release`.
   */
  async setAside(key: LeasedKey, ms: number): Promise<void> {
    await this.db.query(
      `UPDATE idempotency_keys SET locked_until = clock_timestamp() + make_interval(secs => $3), lease_token = NULL
        WHERE id = $1 AND lease_token = $2 AND state = 'in_progress'`,
      [key.id, key.leaseToken, Math.max(0, ms) / 1000],
    );
  }

  /**
   * Ends a phase at a recovery point, in the phase's transaction. Still fenced by the lease token, though the phase that
   * calls it acquired the key in this very transaction and holds its row lock.
   */
  async setRecoveryPoint(key: LeasedKey, recoveryPoint: string): Promise<void> {
    await this.db.query(`UPDATE idempotency_keys SET recovery_point = $3 WHERE id = $1 AND lease_token = $2 AND state = 'in_progress'`, [
      key.id,
      key.leaseToken,
      recoveryPoint,
    ]);
    key.recoveryPoint = recoveryPoint;
  }

  /**
   * Locks the key row for a settling transaction: the first lock every settler takes (then order,
   * the operation's own rows), so settlers never deadlock. With `leaseToken`, answers whether this holder
   * still owns the key; without one (a webhook), whether the key is still unfinished.
   */
  async lockForSettling(keyId: string, leaseToken?: string): Promise<{ owned: true } | { owned: false; response: StoredResponse | null }> {
    const [row] = await this.db.query<PhasedKeyRow>(`SELECT ${KEY_COLUMNS} FROM idempotency_keys WHERE id = $1 FOR UPDATE`, [keyId]);
    if (!row) return { owned: false, response: null };
    if (row.state === 'completed') return { owned: false, response: this.cipher.responseOf(row) };
    if (leaseToken !== undefined && row.lease_token !== leaseToken) return { owned: false, response: null };
    return { owned: true };
  }

  /**
   * Completes the key with the answer the request gets (and every retry after it), in the transaction that settled the
   * outcome. From then on the key expires after IDEMPOTENCY_TTL_SECONDS.
   */
  async complete(keyId: string, response: StoredResponse): Promise<void> {
    await this.db.query(
      `UPDATE idempotency_keys
          SET state = 'completed', recovery_point = 'finished', response_status = $2, response_headers = $3,
              response_body = $4, completed_at = now(), expires_at = now() + make_interval(secs => $7),
              locked_until = NULL, lease_token = NULL, response_key_id = $5, response_sealed = $6
        WHERE id = $1 AND state = 'in_progress'`,
      [keyId, ...answerParams(this.cipher.columnsOf(keyId, response)), this.options.ttlSeconds],
    );
  }

  /**
   * Gives the lease back without an answer (the outcome is unknown): a retry with the same key, or
   * the reconciler, may resume at once instead of waiting out the lease. Fenced: a holder that has
   * lost the key releases nothing.
   */
  async release(key: LeasedKey): Promise<void> {
    await this.db.query(
      `UPDATE idempotency_keys SET locked_until = now(), lease_token = NULL WHERE id = $1 AND lease_token = $2 AND state = 'in_progress'`,
      [key.id, key.leaseToken],
    );
  }

  /**
   * Stop calling out `leaseMarginMs` before the lease ends: a retry or the reconciler may take the key
   * over the moment it ends, and the holder's last write (phase 3) must land before that.
   */
  private leased(row: LeaseRow): LeasedKey {
    return {
      id: row.id,
      leaseToken: row.lease_token,
      recoveryPoint: row.recovery_point,
      deadline: monotonicNow() + row.lease_ms_left - this.options.leaseMarginMs,
    };
  }

  /** A key row held by another transaction past lock_timeout: the same answer as a live lease. */
  private async lockTimeoutIsConflict<T>(scope: KeyScope, query: () => Promise<T>): Promise<T> {
    try {
      return await query();
    } catch (err) {
      if (pgErrorCode(err) !== PG.lockNotAvailable) throw err;
      this.note('conflict', scope);
      throw this.leaseHeld(1);
    }
  }

  private note(outcome: IdempotencyOutcome, scope: KeyScope): void {
    this.metrics.note(outcome, scope.clientId, scope.key);
  }

  private leaseHeld(retryAfterSeconds: number): ProblemDetailsException {
    return this.problems.keyInUse(
      `A request with this key is still being processed. Retry after ${retryAfterSeconds} s: if it has not finished by then, the retry resumes it.`,
      retryAfterSeconds,
    );
  }
}
