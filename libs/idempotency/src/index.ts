// The Idempotency-Key layer's HTTP entry, `@idempotent-orders/idempotency` (package.json "exports"); message handlers are
// `@idempotent-orders/idempotency/messages` (messages.ts). Nothing else of the package is public.

// Wiring: once, beside TypeOrmModule.forRoot.
/** The layer's module: `IdempotencyModule.forRoot({ callerScope })` or `forRootAsync({ inject, useFactory })`. */
export { IdempotencyModule } from './idempotency.module.js';
/** `forRoot`'s options (`callerScope`, the TTL, the wait, …), `forRootAsync`'s, and what `callerScope` is given. */
export { type IdempotencyModuleAsyncOptions, type IdempotencyModuleOptions, type IdempotentRequest } from './idempotency-options.js';
/** The key table's entity: list it in TypeORM's `entities`. */
export { IdempotencyKey } from './idempotency-key.entity.js';
/**
 * Writes every error as application/problem+json, the layer's own and the app's: `{ provide: APP_FILTER, useClass: ProblemDetailsFilter }`.
 */
export { ProblemDetailsFilter } from './problem-details.filter.js';

// The handler: a route made safe to retry.
/** Marks a route: claim the key, run the handler in the claim's transaction, store and replay its answer. */
export { Idempotent, type IdempotentOptions } from './idempotent.decorator.js';
/** The request header that carries the key, and the response header that marks a replay (`Idempotent-Replayed: true`). */
export { IDEMPOTENCY_KEY_HEADER, IDEMPOTENT_REPLAYED_HEADER } from './idempotency-key-header.js';
/** SQL and TypeORM in the open transaction; `transaction(fn)` outside a handler. */
export { Database } from './database.js';

// Phased external calls: a call to another service that cannot be rolled back (docs/patterns/phased-external-calls.md).
/** Claim with a lease, recovery points, settling fenced by the lease token, take-over of expired leases. */
export { type Acquired, AtomicPhases, type LeasedKey } from './atomic-phases.js';
/** Who owns a key (caller, key, fingerprint), and an answer as stored and replayed. */
export { type KeyScope, type StoredResponse } from './idempotency-keys.service.js';
/** Builds a stored answer, and writes one to the response (Express or Fastify). */
export { type IdempotentReply, jsonResponse, problemResponse, writeStoredResponse } from './stored-response.js';
/** The monotonic clock a `LeasedKey.deadline` is measured on. */
export { monotonicNow } from './monotonic-clock.js';

// The migration: the layer's table, in one of your migrations.
/** `up` and `down` of a migration that creates (drops) the `idempotency_keys` table. */
export { createIdempotencyKeysTable, dropIdempotencyKeysTable } from './idempotency-keys-table.js';

// Errors.
/** An error that is already an RFC 9457 problem (the layer's 400/401/409/422 are), and how any HttpException becomes one. */
export { type Problem, ProblemDetailsException, problemOf } from './problem-details.js';
/** No pooled connection became free in time: the app is overloaded, answer 503. */
export { PoolExhaustedError } from './database.js';
/** PostgreSQL answered COMMIT with ROLLBACK (a failed statement's error was caught and ignored): nothing was kept. */
export { TransactionRolledBackError } from './database.js';
/**
 * The transaction's seam, each said loudly: used after it ended (work its handler left running), two nested transactions
 * at once on its connection, a nested transaction asking for another isolation level.
 */
export { ConcurrentNestedTransactionError, IsolationLevelError, TransactionEndedError } from './typeorm-transaction.js';

// Parts of the layer for an app that answers as the layer does.
/**
 * The layer's outcome counters (`idempotency_requests_total`): a guard that refuses a request for the layer (a route
 * that takes a second kind of key) counts its refusal here, as the interceptor would.
 */
export { IdempotencyMetrics } from './idempotency-metrics.js';
/**
 * The Idempotency-Key header's parser (either RFC 8941 form, a 400 problem otherwise) and the fingerprint a key is
 * bound to (method, path, canonical body, bound headers): for a service that implements the same header itself.
 */
export { parseIdempotencyKey } from './idempotency-key-header.js';
export { fingerprintRequest } from './request-fingerprint.js';
/**
 * How the layer tells PostgreSQL's errors apart (SQLSTATE codes, the driver's and the socket's words): the database
 * unreachable, a lock/deadlock/serialization conflict, a unique violation, a cached plan a schema change invalidated.
 * An app's exception filter that answers these (503, 409) uses the same tests, so it and the layer never disagree.
 */
export {
  DatabaseNotAnsweringError,
  isCachedPlanInvalidated,
  isDatabaseUnavailable,
  isTransientConflict,
  isUniqueViolation,
  PG,
  pgErrorCode,
} from './pg-errors.js';
/** JSON with sorted keys, as the request fingerprint uses it: equal values, equal text. */
export { canonicalJson } from './canonical-json.js';
/** Deletes in bounded batches until a batch comes back short: the reaper's loop, for an app's own tables too. */
export { deleteInBatches } from './delete-in-batches.js';
