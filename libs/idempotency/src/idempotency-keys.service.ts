import { Inject, Injectable } from '@nestjs/common';
import { Database } from './database.js';
import { IDEMPOTENCY_OPTIONS, type ResolvedIdempotencyOptions } from './idempotency-options.js';

export interface KeyScope {
  clientId: string;
  key: string;
  fingerprint: string;
  method: string;
  path: string;
}

export interface StoredResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

export interface KeyRecord {
  id: string;
  fingerprint: string;
  expired: boolean;
  /** How long the key has left to live, as PostgreSQL counts (null when it never expires: unfinished). */
  expiresInMs: number | null;
  /** null while the key is unfinished (only a phased handler ever commits it so). */
  response: StoredResponse | null;
}

export type Claim =
  /** This request owns the key: run the handler, then record its response in the same transaction. */
  | { kind: 'claimed'; id: string }
  /** Another request had the key (committed before, or while this one waited on its lock). */
  | { kind: 'existing'; record: KeyRecord; waited: boolean }
  /** The key changed hands again and again while this request tried to claim it: it should retry shortly. */
  | { kind: 'contended' };

interface KeyRow {
  id: string;
  fingerprint: string;
  state: 'in_progress' | 'completed';
  expired: boolean;
  expires_in_ms: number | null;
  response_status: number | null;
  response_headers: Record<string, string> | null;
  response_body: string | null;
  claimed: boolean;
}

const toRecord = (row: KeyRow): KeyRecord => ({
  id: row.id,
  fingerprint: row.fingerprint,
  expired: row.expired,
  expiresInMs: row.expires_in_ms,
  response:
    row.state === 'completed'
      ? { status: row.response_status!, headers: row.response_headers ?? {}, body: row.response_body! }
      : null,
});

// An unfinished phased key expires at 'infinity', which no interval can measure.
const KEY_COLUMNS = `id, fingerprint, state, expires_at <= now() AS expired,
  CASE WHEN isfinite(expires_at) THEN (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8 END AS expires_in_ms,
  response_status, response_headers, response_body`;

/**
 * Claim or find in ONE statement. The INSERT either takes the key or, when a row exists, does
 * nothing; the SELECT half then returns that row. If the row belonged to a transaction still in
 * flight, the INSERT first waits for it (bounded by lock_timeout). A row committed during that wait
 * is newer than this statement's snapshot, so nothing comes back and the caller reads it again: an
 * empty result means "waited". The two halves can never both return a row (the SELECT cannot see
 * the INSERT's row), but the caller picks by `claimed`, not by position.
 */
const CLAIM_KEY = `
  WITH claimed AS (
    INSERT INTO idempotency_keys (client_id, key, fingerprint, request_method, request_path, expires_at)
    VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6))
    ON CONFLICT ON CONSTRAINT uq_idempotency_keys_client_key DO NOTHING
    RETURNING ${KEY_COLUMNS}, true AS claimed
  )
  SELECT * FROM claimed
  UNION ALL
  SELECT ${KEY_COLUMNS}, false AS claimed FROM idempotency_keys WHERE client_id = $1 AND key = $2`;

/**
 * An expired, COMPLETED key counts as absent: the first request to see it takes it over. The row
 * lock makes that a race with one winner; a loser's UPDATE waits, re-checks the WHERE, matches
 * nothing. An unfinished key is never taken over, however old: only a phased handler (payments)
 * commits one, and it belongs to that handler's recovery under its lease, not to the TTL.
 */
const TAKE_OVER_EXPIRED_KEY = `
  UPDATE idempotency_keys
     SET fingerprint = $3, request_method = $4, request_path = $5, state = 'in_progress',
         recovery_point = 'started', locked_until = NULL, response_status = NULL,
         response_headers = NULL, response_body = NULL, created_at = now(), completed_at = NULL,
         expires_at = now() + make_interval(secs => $6)
   WHERE client_id = $1 AND key = $2 AND expires_at <= now() AND state = 'completed'
  RETURNING id`;

/** Each extra round means another request committed, took over or reaped the key meanwhile; three in a row is a storm, told to retry. */
const MAX_CLAIM_ROUNDS = 3;

/** The idempotency_keys table: claim, find, record. Every query is scoped by client. */
@Injectable()
export class IdempotencyKeysService {
  constructor(
    private readonly db: Database,
    @Inject(IDEMPOTENCY_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
  ) {}

  /**
   * Must run inside the transaction that will also hold the handler's writes and the response.
   * `lockWaitMs`: what is left of this request's wait for a request in flight with the same key
   * (the transaction's lock_timeout, the `waitMs` option, when not given). It bounds the claim's lock
   * waits only; the handler's own lock waits keep the transaction's lock_timeout.
   */
  async claimKey(scope: KeyScope, lockWaitMs?: number): Promise<Claim> {
    // Both settings ride along with the statements next to them: no round trip of their own.
    if (lockWaitMs !== undefined) this.db.setLockTimeout(lockWaitMs);
    const claim = await this.claim(scope);
    // Not reached when a claim statement failed: the transaction is aborted and rolls back anyway.
    if (lockWaitMs !== undefined) this.db.setLockTimeout();
    return claim;
  }

  private async claim(scope: KeyScope): Promise<Claim> {
    const params = [scope.clientId, scope.key, scope.fingerprint, scope.method, scope.path, this.options.ttlSeconds];
    const rows = await this.db.query<KeyRow>(CLAIM_KEY, params);
    const mine = rows.find((r) => r.claimed);
    if (mine) return { kind: 'claimed', id: mine.id };
    const seen = rows.find((r) => !r.claimed);
    for (let round = 0; round < MAX_CLAIM_ROUNDS; round++) {
      const record = round === 0 && seen ? toRecord(seen) : await this.findKey(scope.clientId, scope.key);
      if (!record) {
        // Reaped between our INSERT and this read: claim it afresh.
        const again = (await this.db.query<KeyRow>(CLAIM_KEY, params)).find((r) => r.claimed);
        if (again) return { kind: 'claimed', id: again.id };
        continue;
      }
      if (!record.expired || !record.response) return { kind: 'existing', record, waited: !seen };
      const [taken] = await this.db.query<{ id: string }>(TAKE_OVER_EXPIRED_KEY, params);
      if (taken) return { kind: 'claimed', id: taken.id };
    }
    return { kind: 'contended' };
  }

  private async findKey(clientId: string, key: string): Promise<KeyRecord | undefined> {
    const [row] = await this.db.query<KeyRow>(`SELECT ${KEY_COLUMNS} FROM idempotency_keys WHERE client_id = $1 AND key = $2`, [clientId, key]);
    return row && toRecord(row);
  }

  /** Completes the claim with the response to replay. Same transaction as the claim; sent with its COMMIT. */
  recordResponse(id: string, response: StoredResponse): void {
    this.db.defer(
      `UPDATE idempotency_keys
          SET state = 'completed', response_status = $2, response_headers = $3, response_body = $4, completed_at = now()
        WHERE id = $1`,
      [id, response.status, response.headers, response.body],
    );
  }

  /**
   * Deletes up to `batchSize` expired, completed keys. SKIP LOCKED lets several instances reap at
   * once without waiting on each other or on a request that is taking an expired key over.
   * In-progress keys of phased handlers are left to their recovery, which owns them.
   */
  async reapExpiredKeys(batchSize: number): Promise<number> {
    const rows = await this.db.query<{ id: string }>(
      `DELETE FROM idempotency_keys WHERE id IN (
         SELECT id FROM idempotency_keys
          WHERE expires_at <= now() AND state = 'completed'
          ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)
       RETURNING id`,
      [batchSize],
    );
    return rows.length;
  }
}
