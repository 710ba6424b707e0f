import { type ArgumentsHost, Catch, type ExceptionFilter, HttpException, Logger } from '@nestjs/common';
import type { FastifyReply as Response, FastifyRequest as Request } from 'fastify';
import { PoolExhaustedError, problemOf } from '@idempotent-orders/idempotency';
import { isCachedPlanInvalidated, isDatabaseUnavailable, isDataException, isTransientConflict, isUniqueViolation } from './pg-errors.js';
import { plainProblem, type Problem, PROBLEM_CONTENT_TYPE, ProblemException } from './problem.js';

/** Seconds to wait before retrying after a lock conflict or a full pool: long enough for most requests in the way to finish. */
const RETRY_AFTER_SECONDS = 1;
/**
 * Seconds to wait while the database is unreachable: a restart or failover takes seconds, and sooner retries only meet the same refusal.
 */
const DATABASE_RETRY_AFTER_SECONDS = 5;

/**
 * Turns anything thrown into a problem and its headers. Shared by the filter and the idempotency layer, so a stored response is
 * byte-identical to the one first sent.
 */
export function toProblem(exception: unknown): { problem: Problem; headers: Record<string, string> } {
  // The Idempotency-Key layer's own problems, the service's, and Nest's HttpExceptions.
  if (exception instanceof HttpException) return problemOf(exception);
  // Refusals of client input by Fastify or Node (a body over the limit, a malformed URL, a client that hung up
  // mid-body): they carry their 4xx status. Before the database checks: a client's ECONNRESET is not the
  // database's.
  const status = (exception as { statusCode?: unknown } | null)?.statusCode;
  if (typeof status === 'number' && status >= 400 && status < 500) {
    const message = (exception as { message?: unknown }).message;
    return { problem: plainProblem(status, typeof message === 'string' ? message : undefined), headers: {} };
  }
  if (isUniqueViolation(exception)) {
    // Services catch the violations they expect; one that escapes is still a duplicate, not a server fault.
    return {
      problem: ProblemException.of(409, 'duplicate', 'Duplicate', 'The request conflicts with an existing resource.').problem,
      headers: {},
    };
  }
  if (exception instanceof PoolExhaustedError) {
    return {
      problem: ProblemException.of(503, 'overloaded', 'Service overloaded', 'Every database connection is busy; retry shortly.').problem,
      headers: { 'Retry-After': String(RETRY_AFTER_SECONDS) },
    };
  }
  if (isDatabaseUnavailable(exception)) {
    return {
      problem: ProblemException.of(
        503,
        'database-unavailable',
        'Database unavailable',
        'The database cannot be reached right now. Retry shortly with the same Idempotency-Key: a write that did happen is replayed, not repeated.',
      ).problem,
      headers: { 'Retry-After': String(DATABASE_RETRY_AFTER_SECONDS) },
    };
  }
  if (isCachedPlanInvalidated(exception)) {
    return {
      problem: ProblemException.of(
        503,
        'schema-changed',
        'Schema changed',
        'The database schema changed under this request and it was rolled back. Retry shortly with the same Idempotency-Key.',
      ).problem,
      headers: { 'Retry-After': String(RETRY_AFTER_SECONDS) },
    };
  }
  if (isDataException(exception)) {
    return {
      problem: ProblemException.of(400, 'invalid-value', 'Invalid value', 'A value in the request cannot be stored or compared.').problem,
      headers: {},
    };
  }
  if (isTransientConflict(exception)) {
    return {
      problem: ProblemException.of(
        409,
        'concurrent-request',
        'A concurrent request holds this resource',
        'Another request is changing this resource right now; retry shortly.',
      ).problem,
      headers: { 'Retry-After': String(RETRY_AFTER_SECONDS) },
    };
  }
  return {
    problem: plainProblem(500, 'An unexpected error occurred. It was logged with the request id given in X-Request-Id.'),
    headers: {},
  };
}

/** The driver's or the system's own words for a refusal: its code and first line, never a stack. */
function causeOf(exception: unknown): string {
  const { code, message } = (exception ?? {}) as { code?: unknown; message?: unknown };
  const text = typeof message === 'string' ? message.split('\n')[0] : String(exception);
  return typeof code === 'string' ? `${code}: ${text}` : text;
}

/**
 * Writes `exception` as a problem. ProblemFilter calls it for everything Nest routes; http-app for what Fastify's
 * router refuses before Nest sees the request (a malformed URL, an over-long path parameter).
 */
export function sendProblem(exception: unknown, req: Request, res: Response, logger: Pick<Logger, 'error' | 'warn' | 'log'>): void {
  const { problem, headers } = toProblem(exception);
  if (problem.status === 500) {
    logger.error({ err: exception, requestId: req.id }, `unhandled error on ${req.method} ${req.originalUrl}`);
  } else if (problem.status > 500) {
    // An answer the service chose (the database down, every connection busy, a payment pending, the provider away):
    // expected while it lasts, so one line without a stack; an outage of thousands of requests must not bury the log.
    logger.warn(
      { requestId: req.id, type: problem.type, cause: causeOf(exception) },
      `${problem.status} ${problem.title} on ${req.method} ${req.originalUrl}`,
    );
  } else if (Logger.isLevelEnabled('log')) {
    // A refusal (4xx): one line at info, the only line a request gets there (request lines are debug's, app.module.ts).
    logger.log({ requestId: req.id, type: problem.type }, `${problem.status} ${problem.title} on ${req.method} ${req.originalUrl}`);
  }
  if (res.sent || res.raw.headersSent) return;
  // A handler may have set these for a write that then rolled back (the idempotency layer records
  // and commits after the handler returns): an error carries only the problem's own headers.
  res.removeHeader('Location');
  res.removeHeader('ETag');
  res.status(problem.status).headers(headers).type(`${PROBLEM_CONTENT_TYPE}; charset=utf-8`).send(JSON.stringify(problem));
}

/** The one place that writes error responses: every error is application/problem+json, with no stack or internals. */
@Catch()
export class ProblemFilter implements ExceptionFilter {
  private readonly logger = new Logger('ProblemFilter');

  catch(exception: unknown, host: ArgumentsHost): void {
    const http = host.switchToHttp();
    sendProblem(exception, http.getRequest<Request>(), http.getResponse<Response>(), this.logger);
  }
}
