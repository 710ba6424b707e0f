import { Inject, Injectable } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { Database } from './database.js';
import { IDEMPOTENCY_OPTIONS, type ResolvedIdempotencyOptions } from './idempotency-options.js';
import { answerParams, StoredResponseCipher } from './stored-response-cipher.js';

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
  /**
   * This request owns the key: run the handler, then record its response in the same transaction.
   * `id` is the row's when an expired key was taken over; a new key has no row until its answer is recorded.
   */
  | { kind: 'claimed'; id?: string }
  /** Another request had the key (committed before, or while this one waited for it). */
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
  response_key_id: string | null;
  response_sealed: Buffer | null;
}

/** An expired answer is never sent (the key is taken over): it is not opened, so a key retired after its TTL is not needed. */
const toRecord = (row: KeyRow, cipher: StoredResponseCipher): KeyRecord => ({
  id: row.id,
  fingerprint: row.fingerprint,
  expired: row.expired,
  expiresInMs: row.expires_in_ms,
  response: row.state !== 'completed' ? null : cipher.responseOf(row.expired ? { ...row, response_sealed: null } : row),
});

// An unfinished phased key expires at 'infinity', which no interval can measure.
const KEY_COLUMNS = `id, fingerprint, state, expires_at <= now() AS expired,
  CASE WHEN isfinite(expires_at) THEN (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8 END AS expires_in_ms,
  response_status, response_headers, response_body, response_key_id, response_sealed`;

/**
 * Requests with one (client, key) take turns on a transaction-scoped advisory lock of the pair,
 * released by COMMIT, ROLLBACK or a dropped connection (so a crash never leaves it held; and a
 * transaction pooler keeps it, since it lives and dies with the transaction). Two int4 hashes make
 * a 64-bit lock key; a collision only makes an unrelated request wait its turn. The lock, not a row,
 * is what a duplicate waits on: a new key's row is written once, completed, with its answer.
 * Tried first, so a request that finds it taken knows it waited (and the find beside it is read again).
 */
export const TRY_LOCK_KEY = `SELECT pg_try_advisory_xact_lock(hashtext($1), hashtext($2)) AS locked`;
const LOCK_KEY = `SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))`;

/**
 * Read under the lock, in a statement of its own: its snapshot is taken after the lock is held, so it sees whatever the holder before
 * committed.
 */
export const FIND_KEY = `SELECT ${KEY_COLUMNS} FROM idempotency_keys WHERE client_id = $1 AND key = $2`;

/**
 * A new key, written once with its answer (sent with the COMMIT). Its unique constraint still
 * decides: a key row committed meanwhile by something that does not take the lock — a phased
 * handler's claim, a process of an older build during a rolling deploy — makes this fail with
 * 23505, the transaction rolls back, and the request claims again (and replays that row).
 */
export const INSERT_COMPLETED_KEY = `
  INSERT INTO idempotency_keys (client_id, key, fingerprint, request_method, request_path, state,
                                response_status, response_headers, response_body, response_key_id, response_sealed, id,
                                completed_at, expires_at)
  VALUES ($1, $2, $3, $4, $5, 'completed', $6, $7, $8, $9, $10, $11, now(), now() + make_interval(secs => $12))`;

/**
 * An expired, COMPLETED key counts as absent: the first request to see it takes it over. The row
 * lock makes that a race with one winner; a loser's UPDATE waits, re-checks the WHERE, matches
 * nothing. An unfinished key is never taken over, however old: only a phased handler (AtomicPhases)
 * commits one, and it belongs to that handler's recovery under its lease, not to the TTL.
 */
const TAKE_OVER_EXPIRED_KEY = `
  UPDATE idempotency_keys
     SET fingerprint = $3, request_method = $4, request_path = $5, state = 'in_progress',
         recovery_point = 'started', locked_until = NULL, response_status = NULL,
         response_headers = NULL, response_body = NULL, created_at = now(), completed_at = NULL,
         response_key_id = NULL, response_sealed = NULL,
         expires_at = now() + make_interval(secs => $6)
   WHERE client_id = $1 AND key = $2 AND expires_at <= now() AND state = 'completed'
  RETURNING id`;

/** Each extra round means the expired key was reaped or taken over meanwhile; three in a row is a storm, told to retry. */
const MAX_CLAIM_ROUNDS = 3;

/** The idempotency_keys table: claim, find, record. Every query is scoped by client. */
@Injectable()
export class IdempotencyKeysService {
  constructor(
    private readonly db: Database,
    @Inject(IDEMPOTENCY_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
    private readonly cipher: StoredResponseCipher,
  ) {}

  /**
   * Must run inside the transaction that will also hold the handler's writes and the response.
   * `lockWaitMs`: what is left of this request's wait for a request in flight with the same key
   * (the transaction's lock_timeout, the `waitMs` option, when not given). It bounds the claim's lock
   * waits only; the handler's own lock waits keep the transaction's lock_timeout.
   */
  async claimKey(scope: KeyScope, lockWaitMs?: number): Promise<Claim> {
    if (lockWaitMs !== undefined) await this.db.setLockTimeout(lockWaitMs);
    const claim = await this.claim(scope);
    // Not reached when a claim statement failed: the transaction is aborted and rolls back anyway.
    if (lockWaitMs !== undefined) await this.db.setLockTimeout();
    return claim;
  }

  private async claim(scope: KeyScope): Promise<Claim> {
    const key = [scope.clientId, scope.key];
    // The lock first, then the read, in two statements: the read's snapshot must be taken after the lock is held.
    const [{ locked }] = await this.db.query<{ locked: boolean }>(TRY_LOCK_KEY, key);
    if (!locked) {
      // Another request holds the key: wait for it (lock_timeout), then read what it left.
      await this.db.query(LOCK_KEY, key);
    }
    let row = (await this.db.query<KeyRow>(FIND_KEY, key))[0];
    const waited = !locked;
    for (let round = 0; round < MAX_CLAIM_ROUNDS; round++) {
      if (!row) return { kind: 'claimed' };
      const record = toRecord(row, this.cipher);
      if (!record.expired || !record.response) return { kind: 'existing', record, waited };
      const [taken] = await this.db.query<{ id: string }>(TAKE_OVER_EXPIRED_KEY, [
        ...key,
        scope.fingerprint,
        scope.method,
        scope.path,
        this.options.ttlSeconds,
      ]);
      if (taken) return { kind: 'claimed', id: taken.id };
      // Reaped, or taken over by a process that does not take the lock: read it again.
      row = (await this.db.query<KeyRow>(FIND_KEY, key))[0];
    }
    return { kind: 'contended' };
  }

  /**
   * Completes the claim with the response to replay, in the claim's transaction: a new key's one write of its row, or
   * the update of the expired row it took over.
   */
  async recordResponse(claim: { id?: string }, scope: KeyScope, response: StoredResponse): Promise<void> {
    if (claim.id === undefined) {
      await this.db.query(INSERT_COMPLETED_KEY, [
        scope.clientId,
        scope.key,
        scope.fingerprint,
        scope.method,
        scope.path,
        ...this.newRowAnswerParams(response),
        this.options.ttlSeconds,
      ]);
      return;
    }
    await this.db.query(
      `UPDATE idempotency_keys
          SET state = 'completed', response_status = $2, response_headers = $3, response_body = $4, completed_at = now(),
              response_key_id = $5, response_sealed = $6
        WHERE id = $1`,
      [claim.id, ...answerParams(this.cipher.columnsOf(claim.id, response))],
    );
  }

  /** $6–$11 of INSERT_COMPLETED_KEY: the answer's columns and the new row's id, chosen here since a sealed answer is bound to its row. */
  private newRowAnswerParams(response: StoredResponse): unknown[] {
    const id = randomUUID();
    return [...answerParams(this.cipher.columnsOf(id, response)), id];
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
