import { STATUS_CODES } from 'node:http';
import { type Problem, ProblemDetailsException } from '@idempotent-orders/idempotency';

export { type Problem };

export const PROBLEM_CONTENT_TYPE = 'application/problem+json';

/** For a status with nothing more to say than its name (RFC 9457 §4.2.1). */
export function plainProblem(status: number, detail?: string): Problem {
  return { type: 'about:blank', title: STATUS_CODES[status] ?? 'Error', status, ...(detail ? { detail } : {}) };
}

/** Problem types are URNs: stable identifiers a client can switch on; the title is for people. */
export function problemType(slug: string): string {
  return `urn:idempotent-orders:problem:${slug}`;
}

/**
 * An error that is already a problem: thrown by services for business outcomes and by the
 * framework glue for client errors. `headers` are sent with it (Retry-After, ETag, …).
 */
export class ProblemException extends ProblemDetailsException {
  static of(
    status: number,
    slug: string,
    title: string,
    detail: string,
    extra: Record<string, unknown> = {},
    headers: Record<string, string> = {},
  ): ProblemException {
    return new ProblemException({ type: problemType(slug), title, status, detail, ...extra }, headers);
  }
}
