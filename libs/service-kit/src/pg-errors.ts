import {
  isCachedPlanInvalidated,
  isDatabaseUnavailable,
  isTransientConflict,
  isUniqueViolation,
  PG,
  pgErrorCode,
} from '@idempotent-orders/idempotency';

/**
 * PostgreSQL's errors as the service and its apps tell them apart. The codes and most tests are the idempotency
 * layer's (its public entry), so an error the layer counts as "database unavailable" is one here too: one mapping.
 */
export { isCachedPlanInvalidated, isDatabaseUnavailable, isTransientConflict, isUniqueViolation, PG, pgErrorCode };

/**
 * SQLSTATE class 22, data exceptions: a value PostgreSQL cannot take (bad date, NUL in text, out of
 * range). Input validation should stop these first; this is the backstop that keeps them 4xx.
 */
export function isDataException(err: unknown): boolean {
  return pgErrorCode(err)?.startsWith('22') ?? false;
}

/**
 * Runs `fn` (a whole transaction) once more when it lost a deadlock or a serialization failure.
 * Writers here take row locks in one order, so this should not happen; if it does, the loser retries.
 */
export async function retryOnceOnDeadlock<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    const code = pgErrorCode(err);
    if (code !== PG.deadlockDetected && code !== PG.serializationFailure) throw err;
    return fn();
  }
}
