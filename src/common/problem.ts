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

/** Problem types are URNs: stable identifiers a client can switch on; the title is for people. */
export function problemType(slug: string): string {
  return `urn:idempotent-orders:problem:${slug}`;
}

/** For a status with nothing more to say than its name (RFC 9457 §4.2.1). */
export function plainProblem(status: number, detail?: string): Problem {
  return { type: 'about:blank', title: STATUS_CODES[status] ?? 'Error', status, ...(detail ? { detail } : {}) };
}

/**
 * An error that is already a problem: thrown by services for business outcomes and by the
 * framework glue for client errors. `headers` are sent with it (Retry-After, ETag, …).
 */
export class ProblemException extends HttpException {
  constructor(
    readonly problem: Problem,
    readonly headers: Record<string, string> = {},
  ) {
    super(problem, problem.status);
  }

  static of(status: number, slug: string, title: string, detail: string, extra: Record<string, unknown> = {}, headers: Record<string, string> = {}): ProblemException {
    return new ProblemException({ type: problemType(slug), title, status, detail, ...extra }, headers);
  }
}
