import { QueryFailedError } from 'typeorm';

/** The one place that knows PostgreSQL's SQLSTATE codes. */
export const PG = {
  uniqueViolation: '23505',
  checkViolation: '23514',
  lockNotAvailable: '55P03',
  deadlockDetected: '40P01',
  serializationFailure: '40001',
  queryCanceled: '57014',
} as const;

interface DriverError {
  code?: string;
  constraint?: string;
}

function driverError(err: unknown): DriverError | undefined {
  if (err instanceof QueryFailedError) return err.driverError as DriverError;
  // Errors straight from `pg` (raw pool queries) carry the same fields.
  if (err && typeof err === 'object' && 'code' in err && 'severity' in err) return err as DriverError;
  return undefined;
}

export function pgErrorCode(err: unknown): string | undefined {
  return driverError(err)?.code;
}

/** True when `err` is a unique violation, of `constraint` when one is named. */
export function isUniqueViolation(err: unknown, constraint?: string): boolean {
  const e = driverError(err);
  return e?.code === PG.uniqueViolation && (constraint === undefined || e.constraint === constraint);
}

/**
 * SQLSTATE class 22, data exceptions: a value PostgreSQL cannot take (bad date, NUL in text, out of
 * range). Input validation should stop these first; this is the backstop that keeps them 4xx.
 */
export function isDataException(err: unknown): boolean {
  return pgErrorCode(err)?.startsWith('22') ?? false;
}

/** Lock waits past lock_timeout, deadlocks, serialization failures: the same request may succeed if retried. */
export function isTransientConflict(err: unknown): boolean {
  const code = pgErrorCode(err);
  return code === PG.lockNotAvailable || code === PG.deadlockDetected || code === PG.serializationFailure;
}
