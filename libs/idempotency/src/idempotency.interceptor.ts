import { type CallHandler, type ExecutionContext, HttpException, Inject, Injectable, type NestInterceptor } from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { performance } from 'node:perf_hooks';
import { from, lastValueFrom, type Observable, of } from 'rxjs';
import { Database } from './database.js';
import { IDEMPOTENCY_OPTIONS, type IdempotentRequest, type ResolvedIdempotencyOptions } from './idempotency-options.js';
import { isUniqueViolation, PG, pgErrorCode } from './pg-errors.js';
import { IDEMPOTENT, type IdempotentOptions } from './idempotent-route.js';
import { IdempotencyMetrics, type IdempotencyOutcome } from './idempotency-metrics.js';
import { type Claim, IdempotencyKeysService, type KeyRecord, type KeyScope, type StoredResponse } from './idempotency-keys.service.js';
import { IdempotencyProblems } from './idempotency-problems.js';
import { KeyLines } from './key-lines.js';
import { PROBLEM_CONTENT_TYPE, type ProblemDetailsException } from './problem-details.js';
import { type CompletedKey, keySlot, readClocks, ReplayCache } from './replay-cache.js';
import { type IdempotentReply, pickHeaders, writeStoredResponse } from './stored-response.js';

/**
 * Business outcomes a handler reached: stored and replayed like a success. Not stored, so the key
 * is free again: 400 (the request was not understood — fix it and retry with the same key),
 * 401/403 (never reached the handler's decision), 412/428 (preconditions of a later request),
 * and 5xx (the transaction rolled back, nothing happened).
 */
const STORED_CLIENT_ERRORS = new Set([402, 404, 409, 410, 422]);

/** A problem that says "retry later" describes the moment, not the outcome: storing it would refuse every retry of the key. */
const isTemporary = (headers: Record<string, string>) => Object.keys(headers).some((h) => h.toLowerCase() === 'retry-after');

/** A duplicate that gave up waiting is told to come back in a second: most requests finish well within that. */
const OUTSTANDING_RETRY_AFTER_SECONDS = 1;

const SAVEPOINT = 'idempotent_handler';
/** The key's unique constraint: (client, key) has one row. */
const KEY_CONSTRAINT = 'uq_idempotency_keys_client_key';
const JSON_CONTENT_TYPE = 'application/json; charset=utf-8';

/** What the transaction decided: an answer to send, the first time (a success or a stored business problem) or again. */
interface Execution {
  response: StoredResponse;
  replayed: boolean;
  outcome: IdempotencyOutcome;
}

/**
 * The Idempotency-Key layer for handlers marked @Idempotent(). In ONE transaction it claims the
 * key (the key's advisory lock, then a look for its row), runs the handler, and writes the key's
 * row with the response: a crash at any moment leaves either nothing (the key is free, nothing was
 * written) or the effect with its response. A concurrent duplicate waits for the key's lock — in
 * PostgreSQL, so across any number of service instances — then replays what the first committed.
 */
@Injectable()
export class IdempotencyInterceptor implements NestInterceptor {
  // Nest makes one interceptor per module that uses @Idempotent(): what must be one per process (the
  // lines, the replay cache) are providers of the layer's module.
  constructor(
    private readonly reflector: Reflector,
    private readonly keys: IdempotencyKeysService,
    private readonly db: Database,
    private readonly metrics: IdempotencyMetrics,
    private readonly problems: IdempotencyProblems,
    private readonly lines: KeyLines,
    private readonly replays: ReplayCache,
    @Inject(IDEMPOTENCY_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
  ) {}

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    const options = this.reflector.get<IdempotentOptions | undefined>(IDEMPOTENT, context.getHandler());
    if (!options) return next.handle();
    const req = context.switchToHttp().getRequest<IdempotentRequest>();
    const res = context.switchToHttp().getResponse<IdempotentReply>();
    const raw = req.headers['idempotency-key'];
    if (raw === undefined) {
      if (options.required === false) return next.handle();
      this.metrics.note('missing', this.options.callerScope(req), undefined);
      throw this.problems.keyMissing();
    }
    const scope = this.problems.scopeOf(req, raw, options.boundHeaders);
    // A completed key cannot be in flight: its replay needs neither the line nor the database.
    const completed = this.replays.get(scope.clientId, scope.key);
    if (completed) return of(this.replayCompleted(scope, completed, res));
    return from(this.respond(scope, next, res));
  }

  private replayCompleted(
    scope: KeyScope,
    completed: CompletedKey,
    res: IdempotentReply,
    outcome: 'replayed' | 'waited' = 'replayed',
  ): string {
    this.refuseAnotherRequest(scope, completed.fingerprint);
    this.metrics.note(outcome, scope.clientId, scope.key);
    return writeStoredResponse(res, completed.response, true);
  }

  /**
   * Takes a place in line, waits for the requests ahead, then answers. One deadline covers the whole
   * wait, `waitMs` from arrival: the time in line here, then what is left of it as the
   * claim's lock_timeout (for a request in flight on another instance).
   */
  private async respond(scope: KeyScope, next: CallHandler, res: IdempotentReply): Promise<unknown> {
    const deadline = performance.now() + this.options.waitMs;
    const slot = keySlot(scope.clientId, scope.key);
    const { ahead, leave } = this.lines.join(slot);
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
  private async respondOnce(scope: KeyScope, next: CallHandler, res: IdempotentReply, lockWaitMs: number | undefined): Promise<unknown> {
    let execution: Execution;
    try {
      execution = await this.db.transaction(() => this.execute(scope, next, res, lockWaitMs));
    } catch (err) {
      // A key row committed meanwhile by a claim that does not take the key's lock (a phased handler, an
      // older build during a rolling deploy): everything rolled back. Claim again, which finds that row.
      if (!isUniqueViolation(err, KEY_CONSTRAINT)) throw err;
      execution = await this.db.transaction(() => this.execute(scope, next, res, lockWaitMs ?? this.options.waitMs));
    }
    const { response, replayed, outcome } = execution;
    this.metrics.note(outcome, scope.clientId, scope.key);
    // The stored bytes themselves, so a replay is identical to the first response.
    return writeStoredResponse(res, response, replayed);
  }

  /** In the transaction: claim the key; an existing one is answered from its record, a new one runs the handler. */
  private async execute(scope: KeyScope, next: CallHandler, res: IdempotentReply, lockWaitMs: number | undefined): Promise<Execution> {
    const waitStarted = performance.now();
    // Before the claim is sent: the key's remaining life it reads is counted down from here.
    const claimSentAt = readClocks();
    const claim = await this.claim(scope, lockWaitMs, waitStarted);
    if (claim.kind === 'existing') return this.answerExisting(scope, claim, lockWaitMs, waitStarted, claimSentAt);
    return this.runHandler(scope, claim, next, res);
  }

  /** The key's claim: new or existing; a request still in flight with it past the wait is a 409 (thrown). */
  private async claim(
    scope: KeyScope,
    lockWaitMs: number | undefined,
    waitStarted: number,
  ): Promise<Exclude<Claim, { kind: 'contended' }>> {
    let claim: Claim;
    try {
      claim = await this.keys.claimKey(scope, lockWaitMs);
    } catch (err) {
      if (pgErrorCode(err) === PG.lockNotAvailable) throw this.outstanding(scope, performance.now() - waitStarted);
      throw err;
    }
    if (claim.kind === 'contended') throw this.outstanding(scope, performance.now() - waitStarted);
    return claim;
  }

  private answerExisting(
    scope: KeyScope,
    claim: Extract<Claim, { kind: 'existing' }>,
    lockWaitMs: number | undefined,
    waitStarted: number,
    claimSentAt: ReturnType<typeof readClocks>,
  ): Execution {
    if (claim.waited) this.metrics.wait.observe((performance.now() - waitStarted) / 1000);
    const { record } = claim;
    // Committed and completed, so it stays as it is until it expires. Replayed once, likely
    // replayed again (a retry storm): its next replays are answered from memory.
    if (record.response && !record.expired) {
      this.replays.remember(
        scope.clientId,
        scope.key,
        { fingerprint: record.fingerprint, response: record.response },
        record.expiresInMs ?? 0,
        claimSentAt,
      );
    }
    return this.replay(scope, record, claim.waited || lockWaitMs !== undefined);
  }

  /** Runs the handler after a savepoint, and records its answer: a success, or a business refusal without its writes. */
  private async runHandler(
    scope: KeyScope,
    claim: Extract<Claim, { kind: 'claimed' }>,
    next: CallHandler,
    res: IdempotentReply,
  ): Promise<Execution> {
    // Everything the handler writes can be undone alone, so a business error is stored without them.
    await this.db.savepoint(SAVEPOINT);
    let response: StoredResponse;
    try {
      const value: unknown = await lastValueFrom(next.handle(), { defaultValue: undefined });
      response = this.successOf(value, res);
    } catch (err) {
      response = this.storedRefusalOf(err);
      await this.db.rollbackToSavepoint(SAVEPOINT);
    }
    await this.keys.recordResponse(claim, scope, response);
    return { response, replayed: false, outcome: 'executed' };
  }

  /** The handler's value as the answer to store: its status, the headers kept for replays, the JSON body. */
  private successOf(value: unknown, res: IdempotentReply): StoredResponse {
    const body = value === undefined ? '' : JSON.stringify(value);
    if (body) res.header('Content-Type', JSON_CONTENT_TYPE);
    return { status: res.statusCode, headers: pickHeaders(res.getHeaders(), this.options.replayedHeaders), body };
  }

  /**
   * A business refusal as the answer to store. Anything else is thrown on — validation errors, auth, 5xx, and temporary
   * refusals (they carry Retry-After: ask again later) — so the transaction rolls back and the key is free again.
   */
  private storedRefusalOf(err: unknown): StoredResponse {
    if (!(err instanceof HttpException) || !STORED_CLIENT_ERRORS.has(err.getStatus())) throw err;
    const { problem, headers } = this.options.renderError(err);
    if (isTemporary(headers)) throw err;
    // Sent by the layer itself, not by the app's exception filter: the first answer is the stored bytes, like every replay.
    return {
      status: problem.status,
      headers: { ...pickHeaders(headers, this.options.replayedHeaders), 'content-type': `${PROBLEM_CONTENT_TYPE}; charset=utf-8` },
      body: JSON.stringify(problem),
    };
  }

  private replay(scope: KeyScope, record: KeyRecord, waited: boolean): Execution {
    // An expired key is bound to no request any more; it is only still here because it is unfinished.
    if (!record.expired) this.refuseAnotherRequest(scope, record.fingerprint);
    // Committed but unfinished: a phased handler (AtomicPhases) is mid-way under its lease.
    if (!record.response) throw this.outstanding(scope, 0);
    return { response: record.response, replayed: true, outcome: waited ? 'waited' : 'replayed' };
  }

  /** A key is bound to the request that first used it: anything else sent with it is a 422, and nothing runs. */
  private refuseAnotherRequest(scope: KeyScope, fingerprint: string): void {
    if (fingerprint === scope.fingerprint) return;
    this.metrics.note('mismatch', scope.clientId, scope.key);
    throw this.problems.keyReused();
  }

  private outstanding(scope: KeyScope, waitedMs: number): ProblemDetailsException {
    this.metrics.note('conflict', scope.clientId, scope.key);
    if (waitedMs > 0) this.metrics.wait.observe(waitedMs / 1000);
    return this.problems.keyInUse(
      `A request with this key is still being processed (waited ${Math.round(waitedMs)} ms). Retry after it has finished.`,
      OUTSTANDING_RETRY_AFTER_SECONDS,
    );
  }
}
