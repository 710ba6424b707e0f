import { HttpException } from '@nestjs/common';
import { STATUS_CODES } from 'node:http';

/** RFC 9457 problem details. Extra members (currentStatus, orderId, errors, …) sit beside the standard ones. */
export interface Problem {
  type: string;
  title: string;
  status: number;
  detail?: string;
  [member: string]: unknown;
}

export const PROBLEM_CONTENT_TYPE = 'application/problem+json';

/** For a status with nothing more to say than its name (RFC 9457 §4.2.1). */
export function plainProblem(status: number, detail?: string): Problem {
  return { type: 'about:blank', title: STATUS_CODES[status] ?? 'Error', status, ...(detail ? { detail } : {}) };
}

/**
 * An error that is already a problem, with the headers sent beside it (Retry-After, ETag, …). The
 * layer throws these for its own answers; an app's exception filter writes `problem` as
 * application/problem+json (Nest's default filter writes it as JSON).
 */
export class ProblemDetailsException extends HttpException {
  constructor(
    readonly problem: Problem,
    readonly headers: Record<string, string> = {},
  ) {
    super(problem, problem.status);
  }
}

/**
 * A thrown HttpException as a problem: its own when it carries one, else its status and (below 500) its message. A list
 * of messages (ValidationPipe's, one per failed constraint) becomes the `detail`, joined, and an `errors` member.
 */
export function problemOf(exception: HttpException): { problem: Problem; headers: Record<string, string> } {
  if (exception instanceof ProblemDetailsException) return { problem: exception.problem, headers: exception.headers };
  const status = exception.getStatus();
  const response = exception.getResponse();
  const message = typeof response === 'object' && response && 'message' in response ? response.message : response;
  if (status >= 500) return { problem: plainProblem(status), headers: {} };
  if (Array.isArray(message) && message.length > 0 && message.every((m) => typeof m === 'string')) {
    return { problem: { ...plainProblem(status, message.join('; ')), errors: message }, headers: {} };
  }
  return { problem: plainProblem(status, typeof message === 'string' ? message : undefined), headers: {} };
}
