/**
 * The idempotency package's internals that tests drive by hand, from its source: the package exports none of these
 * and no app code may import them (eslint.config.js allows this file alone to reach into libs/idempotency/src).
 */
export { IdempotencyKeyReaper } from '../../libs/idempotency/src/idempotency-key-reaper.js';
export { resolveOptions as resolveIdempotencyOptions } from '../../libs/idempotency/src/idempotency-options.js';
