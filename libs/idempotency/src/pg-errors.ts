import { QueryFailedError } from 'typeorm';

/** The one place that knows PostgreSQL's SQLSTATE codes (public: the package's entry exports them with the tests below). */
export const PG = {
  uniqueViolation: '23505',
  lockNotAvailable: '55P03',
  deadlockDetected: '40P01',
  serializationFailure: '40001',
  /** The server is shutting down (smart/fast/immediate stop, or pg_terminate_backend). */
  adminShutdown: '57P01',
  /** Another backend crashed and the server is resetting. */
  crashShutdown: '57P02',
  /** The server is starting up, shutting down or in recovery: connections are refused for now. */
  cannotConnectNow: '57P03',
  /**
   * read_only_sql_transaction: a write reached a server that is (now) a standby — a primary demoted in a failover,
   * or a connection made before the proxy switched. Nothing was written; the retry reaches the new primary.
   */
  readOnlyTransaction: '25006',
  /** feature_not_supported: among others, a prepared statement whose result columns a schema change altered. */
  featureNotSupported: '0A000',
  /** The server's max_connections, or the role's or database's CONNECTION LIMIT, is reached: a connect is refused. */
  tooManyConnections: '53300',
  /** The server cannot extend a file: every write fails until space is freed. */
  diskFull: '53100',
  /** The connect's password was refused (a rotation half-done, a wrong secret). */
  invalidPassword: '28P01',
  /** The connect was refused by pg_hba.conf or the role may not log in. */
  invalidAuthorization: '28000',
  /** The connect named a database that does not exist (not yet created, being restored or renamed). */
  invalidCatalogName: '3D000',
  /** A statement cancelled: statement_timeout, or pg_cancel_backend. */
  queryCanceled: '57014',
} as const;

/**
 * The server refused the connection or the write for a reason of its own: its connection slots, its disk, its
 * credentials or its database. Whatever was asked is not the cause, and the same request succeeds once an operator
 * (or a pool elsewhere letting go) fixes it; it is an outage to wait out, not a fault of the request.
 */
const SERVER_REFUSALS = new Set<string>([
  PG.tooManyConnections,
  PG.diskFull,
  PG.invalidPassword,
  PG.invalidAuthorization,
  PG.invalidCatalogName,
]);

/** SQLSTATE class 08, connection exceptions (the connection failed or was lost). */
const CONNECTION_EXCEPTION_CLASS = '08';

/** Node's socket errors for a database server that is down, restarting, or cannot be reached right now. */
const UNREACHABLE_SOCKET_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'EPIPE',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENOTFOUND',
  'EAI_AGAIN',
]);

/**
 * On a Unix-domain socket, two more ways a connect says "not now": the server removes its socket file when it
 * stops, so while it is down the connect finds no file (ENOENT); and a full listen backlog refuses at once
 * (EAGAIN) where TCP would queue. Only from connect(): an ENOENT elsewhere (a missing file) is no outage.
 */
const UNREACHABLE_CONNECT_CODES = new Set(['ENOENT', 'EAGAIN']);

/**
 * pg's own words (its errors carry no code): the socket closed under a client ("Connection
 * terminated unexpectedly", or "… due to connection timeout" when the connect attempt ran out of
 * time), or a query was sent on a client whose connection had already failed.
 */
const LOST_CONNECTION_MESSAGES = [/^Connection terminated\b/, /^Client has encountered a connection error and is not queryable$/];

interface DriverError {
  code?: string;
  constraint?: string;
  message?: string;
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

/** Lock waits past lock_timeout, deadlocks, serialization failures: the same request may succeed if retried. */
export function isTransientConflict(err: unknown): boolean {
  const code = pgErrorCode(err);
  return code === PG.lockNotAvailable || code === PG.deadlockDetected || code === PG.serializationFailure;
}

/**
 * What a retry may get past, though the work itself can be the cause every time: a lock wait past lock_timeout, a
 * deadlock, a serialization failure (isTransientConflict), or a statement cancelled — by statement_timeout (work
 * that always runs too long) or by an operator's pg_cancel_backend (PostgreSQL's message tells them apart, its code
 * does not). A consumer retries these a bounded number of times and counts them against the message, so a message
 * whose effect always meets one is dead-lettered in the end instead of held forever.
 */
export function isContention(err: unknown): boolean {
  return isTransientConflict(err) || pgErrorCode(err) === PG.queryCanceled;
}

/**
 * "cached plan must not change result type": a column was added, dropped or retyped under a named
 * statement this connection prepared, and the statement's result would change. Every later use of it
 * on that connection fails the same way until its statement cache is discarded (Database does).
 * Nothing of the failed transaction was committed: answered 503, the retry succeeds.
 */
export function isCachedPlanInvalidated(err: unknown): boolean {
  const e = driverError(err);
  return e?.code === PG.featureNotSupported && e.message !== undefined && e.message.startsWith('cached plan must not change result type');
}

/** `err` and what it wraps: TypeORM's driverError, an Error's cause, an AggregateError's errors (a connect tried on several addresses). */
function* errorChain(err: unknown, depth = 0): Generator<unknown> {
  if (err === null || err === undefined || depth > 5) return;
  yield err;
  if (typeof err !== 'object') return;
  if (err instanceof QueryFailedError) yield* errorChain(err.driverError, depth + 1);
  if (err instanceof AggregateError) for (const inner of err.errors) yield* errorChain(inner, depth + 1);
  if (err instanceof Error && err.cause !== undefined) yield* errorChain(err.cause, depth + 1);
}

/**
 * No pooled connection came free within the wait, and the last news of the database is that it could not be reached:
 * every connection is held by a statement it does not answer (it restarts behind a pooler, which holds them).
 */
export class DatabaseNotAnsweringError extends Error {
  constructor(options?: ErrorOptions) {
    super('No database connection came free, and the database was last found unreachable', options);
    this.name = 'DatabaseNotAnsweringError';
  }
}

function isUnreachable(err: unknown): boolean {
  if (!err || typeof err !== 'object') return false;
  if (err instanceof DatabaseNotAnsweringError) return true;
  const code = 'code' in err && typeof err.code === 'string' ? err.code : undefined;
  if (code !== undefined) {
    if (UNREACHABLE_SOCKET_CODES.has(code)) return true;
    if (UNREACHABLE_CONNECT_CODES.has(code) && 'syscall' in err && err.syscall === 'connect') return true;
    if (code === PG.adminShutdown || code === PG.crashShutdown || code === PG.cannotConnectNow) return true;
    if (code === PG.readOnlyTransaction && 'severity' in err) return true;
    if ('severity' in err && (code.startsWith(CONNECTION_EXCEPTION_CLASS) || SERVER_REFUSALS.has(code))) return true;
  }
  return err instanceof Error && LOST_CONNECTION_MESSAGES.some((m) => m.test(err.message));
}

/**
 * The database cannot be reached, or the connection was lost under the request: the server is
 * down, restarting or failing over, or refuses the connection (SERVER_REFUSALS: no slot left, a
 * password refused, the database missing). Nothing the request did was committed unless a COMMIT itself
 * was cut off — which an Idempotency-Key retry resolves. Answered 503 + Retry-After, not 500.
 */
export function isDatabaseUnavailable(err: unknown): boolean {
  for (const e of errorChain(err)) if (isUnreachable(e)) return true;
  return false;
}
