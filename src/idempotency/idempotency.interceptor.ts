import { type CallHandler, type ExecutionContext, HttpException, Inject, Injectable, type NestInterceptor } from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import type { FastifyReply as Response, FastifyRequest as Request } from 'fastify';
import { performance } from 'node:perf_hooks';
import { from, lastValueFrom, type Observable, of } from 'rxjs';
import { ProblemException, PROBLEM_CONTENT_TYPE } from '../common/problem.js';
import { toProblem } from '../common/problem.filter.js';
import type { AppConfig } from '../config/app-config.js';
import { APP_CONFIG } from '../config/config.module.js';
import { Database } from '../database/database.service.js';
import { PG, pgErrorCode } from '../database/pg-errors.js';
import { IDEMPOTENT, type IdempotentOptions } from './idempotent.decorator.js';
import { IdempotencyMetrics, type IdempotencyOutcome } from './idempotency-metrics.js';
import { parseIdempotencyKey } from './idempotency-key-header.js';
import { type Claim, IdempotencyKeysService, type KeyRecord, type KeyScope, type StoredResponse } from './idempotency-keys.service.js';
import { keyInUse, keyMissing, keyReused, keyScopeOf } from './idempotency-problems.js';
import { type CompletedKey, keySlot, readClocks, ReplayCache } from './replay-cache.js';
import { writeStoredResponse } from './stored-response.js';

/**
 * Business outcomes a handler reached: stored and replayed like a success. Not stored, so the key
 * is free again: 400 (the request was not understood — fix it and retry with the same key),
 * 401/403 (never reached the handler's decision), 412/428 (preconditions of a later request),
 * and 5xx (the transaction rolled back, nothing happened).
 */
const STORED_CLIENT_ERRORS = new Set([402, 404, 409, 410, 422]);

/** A problem that says "retry later" describes the moment, not the outcome: storing it would refuse every retry of the key. */
const isTemporary = (err: HttpException) => err instanceof ProblemException && Object.keys(err.headers).some((h) => h.toLowerCase() === 'retry-after');

/** Headers that are part of the outcome. Never Set-Cookie: a replay must not hand one client's session to another request. */
const REPLAYED_HEADERS = new Set(['content-type', 'location', 'etag', 'retry-after']);

/** A duplicate that gave up waiting is told to come back in a second: most requests finish well within that. */
const OUTSTANDING_RETRY_AFTER_SECONDS = 1;

/** Bounds the replay cache's memory whatever the bodies weigh: 10 000 typical answers are a few MB. */
const REPLAY_CACHE_MAX_BYTES = 32 * 1024 * 1024;

const SAVEPOINT = 'idempotent_handler';
const JSON_CONTENT_TYPE = 'application/json; charset=utf-8';

type Execution =
  | { kind: 'respond'; response: StoredResponse; replayed: boolean; outcome: IdempotencyOutcome }
  /** The handler raised a business problem; it is stored, and thrown again after the commit for the filter to send. */
  | { kind: 'rethrow'; error: unknown };

/** The headers to store, by lower-case name: Node's own are lower-case, a problem's are spelled `ETag`, `Retry-After`. */
function pickHeaders(headers: Record<string, unknown>): Record<string, string> {
  const picked: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    const lower = name.toLowerCase();
    if (REPLAYED_HEADERS.has(lower) && (typeof value === 'string' || typeof value === 'number')) picked[lower] = String(value);
  }
  return picked;
}

/**
 * The Idempotency-Key layer for handlers marked @Idempotent(). In ONE transaction it claims the
 * key (a unique insert), runs the handler, and records the response: a crash at any moment
 * leaves either nothing (the key is free, nothing was written) or the effect with its response.
 * A concurrent duplicate blocks on the first request's uncommitted key row — in PostgreSQL, so
 * across any number of service instances — then replays what it committed.
 */
@Injectable()
export class IdempotencyInterceptor implements NestInterceptor {
  /**
   * The last request in line for each (client, key) in THIS process: settles once that request has
   * finished, and every one ahead of it. A duplicate that arrives here waits in memory for the one
   * before it, holding no pooled connection, instead of blocking on the key's row lock: a storm of
   * retries cannot drain the pool, not even when the first request fails and the key is free again
   * (then the next in line claims it, and only it). Only a queue in front of the claim, which still
   * decides (and is what makes duplicates on other instances wait).
   */
  private readonly lines = new Map<string, Promise<void>>();

  /** Answers of completed keys that were replayed, for their next replays (see ReplayCache for why that is sound). */
  private readonly replays: ReplayCache;

  constructor(
    private readonly reflector: Reflector,
    private readonly keys: IdempotencyKeysService,
    private readonly db: Database,
    private readonly metrics: IdempotencyMetrics,
    @Inject(APP_CONFIG) private readonly config: AppConfig,
  ) {
    this.replays = new ReplayCache(config.idempotencyReplayCacheEntries, REPLAY_CACHE_MAX_BYTES);
  }

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    const options = this.reflector.get<IdempotentOptions | undefined>(IDEMPOTENT, context.getHandler());
    if (!options) return next.handle();
    const req = context.switchToHttp().getRequest<Request>();
    const res = context.switchToHttp().getResponse<Response>();
    const clientId = req.clientId!;
    const raw = req.headers['idempotency-key'];
    if (raw === undefined) {
      if (!options.required) return next.handle();
      this.metrics.note('missing', clientId, undefined);
      throw keyMissing();
    }
    const scope = keyScopeOf(req, parseIdempotencyKey(raw), options.boundHeaders);
    // A completed key cannot be in flight: its replay needs neither the line nor the database.
    const completed = this.replays.get(scope.clientId, scope.key);
    if (completed) return of(this.replayCompleted(scope, completed, res));
    return from(this.respond(scope, next, res));
  }

  private replayCompleted(scope: KeyScope, completed: CompletedKey, res: Response, outcome: 'replayed' | 'waited' = 'replayed'): string {
    this.refuseAnotherRequest(scope, completed.fingerprint);
    this.metrics.note(outcome, scope.clientId, scope.key);
    return writeStoredResponse(res, completed.response, true);
  }

  /**
   * Takes a place in line, waits for the requests ahead, then answers. One deadline covers the whole
   * wait, IDEMPOTENCY_WAIT_MS from arrival: the time in line here, then what is left of it as the
   * claim's lock_timeout (for a request in flight on another instance).
   */
  private async respond(scope: KeyScope, next: CallHandler, res: Response): Promise<unknown> {
    const deadline = performance.now() + this.config.idempotencyWaitMs;
    const slot = keySlot(scope.clientId, scope.key);
    const ahead = this.lines.get(slot);
    let leave!: () => void;
    const done = new Promise<void>((resolve) => (leave = resolve));
    // Whoever comes next waits for this request AND everyone ahead, even if this one gives up waiting.
    const line = ahead ? ahead.then(() => done) : done;
    this.lines.set(slot, line);
    try {
      if (ahead) {
        await this.waitInLine(ahead, scope, deadline);
        // The request ahead (or the first duplicate after it) has just put the answer in memory.
        const completed = this.replays.get(scope.clientId, scope.key);
        if (completed) return this.replayCompleted(scope, completed, res, 'waited');
      }
      return await this.respondOnce(scope, next, res, ahead ? deadline - performance.now() : undefined);
    } finally {
      leave();
      if (this.lines.get(slot) === line) this.lines.delete(slot);
    }
  }

  /** Waits until every request ahead has finished, or the deadline has passed: then 409 + Retry-After. */
  private async waitInLine(ahead: Promise<void>, scope: KeyScope, deadline: number): Promise<void> {
    const started = performance.now();
    let timer: NodeJS.Timeout | undefined;
    this.metrics.waiting.inc();
    try {
      const ourTurn = await Promise.race([
        ahead.then(() => true),
        new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), Math.max(0, deadline - started)))),
      ]);
      if (!ourTurn) throw this.outstanding(scope, performance.now() - started);
      this.metrics.wait.observe((performance.now() - started) / 1000);
    } finally {
      clearTimeout(timer);
      this.metrics.waiting.dec();
    }
  }

  /** `lockWaitMs`: what is left of the wait after waiting in line (undefined: it did not). */
  private async respondOnce(scope: KeyScope, next: CallHandler, res: Response, lockWaitMs: number | undefined): Promise<unknown> {
    // No read before the claim: the claim returns a key that exists, so a replay costs two round trips
    // (then none: ReplayCache) and a new key saves one, on every create.
    const execution = await this.db.transaction(() => this.execute(scope, next, res, lockWaitMs));
    if (execution.kind === 'rethrow') throw execution.error;
    const { response, replayed, outcome } = execution;
    this.metrics.note(outcome, scope.clientId, scope.key);
    // The stored bytes themselves, so a replay is identical to the first response.
    return writeStoredResponse(res, response, replayed);
  }

  private async execute(scope: KeyScope, next: CallHandler, res: Response, lockWaitMs: number | undefined): Promise<Execution> {
    const waitStarted = performance.now();
    let claim: Claim;
    // Before the claim is sent: the key's remaining life it reads is counted down from here.
    const claimSentAt = readClocks();
    try {
      claim = await this.keys.claimKey(scope, lockWaitMs);
    } catch (err) {
      if (pgErrorCode(err) === PG.lockNotAvailable) throw this.outstanding(scope, performance.now() - waitStarted);
      throw err;
    }
    if (claim.kind === 'contended') throw this.outstanding(scope, performance.now() - waitStarted);
    if (claim.kind === 'existing') {
      const waited = claim.waited || lockWaitMs !== undefined;
      if (claim.waited) this.metrics.wait.observe((performance.now() - waitStarted) / 1000);
      const { record } = claim;
      // Committed and completed, so it stays as it is until it expires. Replayed once, likely
      // replayed again (a retry storm): its next replays are answered from memory.
      if (record.response && !record.expired) {
        this.replays.remember(scope.clientId, scope.key, { fingerprint: record.fingerprint, response: record.response }, record.expiresInMs ?? 0, claimSentAt);
      }
      return this.replay(scope, record, waited);
    }

    // Everything the handler writes can be undone alone, so a business error is stored without them.
    this.db.savepoint(SAVEPOINT);
    try {
      const value: unknown = await lastValueFrom(next.handle(), { defaultValue: undefined });
      const body = value === undefined ? '' : JSON.stringify(value);
      if (body) res.header('Content-Type', JSON_CONTENT_TYPE);
      const response: StoredResponse = { status: res.statusCode, headers: pickHeaders(res.getHeaders()), body };
      this.keys.recordResponse(claim.id, response);
      return { kind: 'respond', response, replayed: false, outcome: 'executed' };
    } catch (err) {
      // Validation errors, auth, 5xx, and temporary refusals (they carry Retry-After: ask again later,
      // e.g. a cancel while a payment is pending): thrown on, the transaction rolls back, the key is free again.
      if (!(err instanceof HttpException) || !STORED_CLIENT_ERRORS.has(err.getStatus()) || isTemporary(err)) throw err;
      this.db.rollbackToSavepoint(SAVEPOINT);
      const { problem, headers } = toProblem(err);
      this.keys.recordResponse(claim.id, {
        status: problem.status,
        headers: { ...pickHeaders(headers), 'content-type': `${PROBLEM_CONTENT_TYPE}; charset=utf-8` },
        body: JSON.stringify(problem),
      });
      this.metrics.note('executed', scope.clientId, scope.key);
      return { kind: 'rethrow', error: err };
    }
  }

  private replay(scope: KeyScope, record: KeyRecord, waited: boolean): Execution {
    // An expired key is bound to no request any more; it is only still here because it is unfinished.
    if (!record.expired) this.refuseAnotherRequest(scope, record.fingerprint);
    // Committed but unfinished: a phased handler (payments) is mid-way under its lease.
    if (!record.response) throw this.outstanding(scope, 0);
    return { kind: 'respond', response: record.response, replayed: true, outcome: waited ? 'waited' : 'replayed' };
  }

  /** A key is bound to the request that first used it: anything else sent with it is a 422, and nothing runs. */
  private refuseAnotherRequest(scope: KeyScope, fingerprint: string): void {
    if (fingerprint === scope.fingerprint) return;
    this.metrics.note('mismatch', scope.clientId, scope.key);
    throw keyReused();
  }

  private outstanding(scope: KeyScope, waitedMs: number): ProblemException {
    this.metrics.note('conflict', scope.clientId, scope.key);
    if (waitedMs > 0) this.metrics.wait.observe(waitedMs / 1000);
    return keyInUse(`A request with this key is still being processed (waited ${Math.round(waitedMs)} ms). Retry after it has finished.`, OUTSTANDING_RETRY_AFTER_SECONDS);
  }
}
