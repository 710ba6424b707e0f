// The Idempotency-Key layer's public entry: import from here only (a lint rule refuses deeper imports).
export { IdempotencyModule } from './idempotency.module.js';
export {
  type EscapingWrites,
  IDEMPOTENCY_OPTIONS,
  type IdempotencyModuleOptions,
  type IdempotentRequest,
  type ResolvedIdempotencyOptions,
  resolveOptions as resolveIdempotencyOptions,
} from './idempotency-options.js';
export { Idempotent, type IdempotentOptions } from './idempotent.decorator.js';
export { IdempotencyInterceptor } from './idempotency.interceptor.js';
export { Database, PoolExhaustedError, type TransactionSettings, transactionSettings } from './database.js';
export { EscapingWriteError } from './typeorm-transaction.js';
export { AtomicPhases, type Acquired, type LeasedKey, STARTED } from './atomic-phases.js';
export { IdempotencyKeysService, type Claim, type KeyRecord, type KeyScope, type StoredResponse } from './idempotency-keys.service.js';
export { IdempotencyKeyReaper } from './idempotency-key-reaper.js';
export { IdempotencyMetrics, type IdempotencyOutcome } from './idempotency-metrics.js';
export { IdempotencyProblems, keyScopeOf } from './idempotency-problems.js';
export { IDEMPOTENCY_KEY_HEADER, parseIdempotencyKey } from './idempotency-key-header.js';
export { fingerprintRequest, normalisePath } from './request-fingerprint.js';
export { type IdempotentReply, jsonResponse, problemResponse, writeStoredResponse } from './stored-response.js';
export { plainProblem, type Problem, PROBLEM_CONTENT_TYPE, ProblemDetailsException, problemOf } from './problem-details.js';
export { ProblemDetailsFilter } from './problem-details.filter.js';
export { IdempotencyKey, type IdempotencyKeyState } from './idempotency-key.entity.js';
export { createIdempotencyKeysTable, dropIdempotencyKeysTable } from './idempotency-keys-table.js';
export * from './pg-errors.js';
export { canonicalJson } from './canonical-json.js';
export { deleteInBatches } from './delete-in-batches.js';
export { monotonicNow } from './monotonic-clock.js';
export { claimMessageStatement, createProcessedMessagesTable, IDEMPOTENT_MESSAGE_DEFAULTS, IdempotentMessage, type IdempotentMessageDefaults, IdempotentMessageInterceptor, type IdempotentMessageOptions, reapProcessedMessages } from './idempotent-message.js';
