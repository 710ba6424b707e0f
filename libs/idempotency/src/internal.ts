// Not the layer's public API: what this repository's service, sandbox and tests share with the layer. The layer needs
// each of these itself, and "one place maps Postgres errors": a second copy in the service would drift. An app that
// copies the layer imports `index.ts` only.

/** PostgreSQL's error codes and what they mean for a request (unique violation, transient conflict, unavailable, …). */
export * from './pg-errors.js';
/** JSON with sorted keys: equal values, equal text. */
export { canonicalJson } from './canonical-json.js';
/** Deletes in bounded batches until a batch comes back short. */
export { deleteInBatches } from './delete-in-batches.js';
/** The request fingerprint a key is bound to, and the header's parser. */
export { fingerprintRequest } from './request-fingerprint.js';
export { parseIdempotencyKey } from './idempotency-key-header.js';
/** The layer's outcome counters, for a guard that answers for the layer. */
export { IdempotencyMetrics } from './idempotency-metrics.js';
/** Reaps expired keys (tests drive it by hand). */
export { IdempotencyKeyReaper } from './idempotency-key-reaper.js';
/** The options with every default filled in. */
export { type ResolvedIdempotencyOptions, resolveOptions as resolveIdempotencyOptions } from './idempotency-options.js';
/** The problem+json media type, and a problem with nothing more to say than its status. */
export { PROBLEM_CONTENT_TYPE, plainProblem } from './problem-details.js';
/** The claim's statements as a create sends them: `npm run bench:create-sql` measures them as they are. */
export { FIND_KEY, INSERT_COMPLETED_KEY, TRY_LOCK_KEY } from './idempotency-keys.service.js';
