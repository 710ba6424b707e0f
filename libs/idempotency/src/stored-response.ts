import type { StoredResponse } from './idempotency-keys.service.js';
import { IDEMPOTENT_REPLAYED_HEADER } from './idempotency-key-header.js';
import { PROBLEM_CONTENT_TYPE, type ProblemDetailsException } from './problem-details.js';

const JSON_CONTENT_TYPE = 'application/json; charset=utf-8';

/** Headers a handler sets for the write it made: on an answer that does not carry them (a rolled-back outcome), they are removed. */
const OUTCOME_HEADERS = ['location', 'etag'];

/** What the layer does with a reply: the methods Fastify's reply and Express's response share. */
export interface IdempotentReply {
  statusCode: number;
  status(code: number): unknown;
  header(name: string, value: string): unknown;
  removeHeader(name: string): unknown;
  getHeaders(): Record<string, unknown>;
}

/** A JSON answer as it is stored under a key and sent: the exact body bytes a replay sends again. */
export function jsonResponse(status: number, body: unknown, headers: Record<string, string> = {}): StoredResponse {
  return { status, headers: { 'content-type': JSON_CONTENT_TYPE, ...lowerCased(headers) }, body: JSON.stringify(body) };
}

/** A business problem as it is stored under a key (402, 404, 409, 422), byte for byte what is sent. */
export function problemResponse(problem: ProblemDetailsException): StoredResponse {
  return {
    status: problem.problem.status,
    headers: { ...lowerCased(problem.headers), 'content-type': `${PROBLEM_CONTENT_TYPE}; charset=utf-8` },
    body: JSON.stringify(problem.problem),
  };
}

/** The headers to store, by lower-case name: Node's own are lower-case, a problem's are spelled `ETag`, `Retry-After`. */
export function pickHeaders(headers: Record<string, unknown>, replayed: readonly string[]): Record<string, string> {
  const picked: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    const lower = name.toLowerCase();
    if (replayed.includes(lower) && (typeof value === 'string' || typeof value === 'number')) picked[lower] = String(value);
  }
  return picked;
}

/**
 * Sends a stored answer; the caller returns `response.body` from the handler so Nest writes exactly
 * those bytes. Headers a handler set for an outcome that was rolled back (a Location before it threw)
 * are not the answer's: only the stored ones go out.
 */
export function writeStoredResponse(res: IdempotentReply, response: StoredResponse, replayed: boolean): string {
  res.status(response.status);
  for (const name of OUTCOME_HEADERS) if (!(name in response.headers)) res.removeHeader(name);
  for (const [name, value] of Object.entries(response.headers)) res.header(name, value);
  if (replayed) res.header(IDEMPOTENT_REPLAYED_HEADER, 'true');
  return response.body;
}

function lowerCased(headers: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.entries(headers).map(([name, value]) => [name.toLowerCase(), value]));
}
