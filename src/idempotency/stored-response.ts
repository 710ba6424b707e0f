import type { FastifyReply } from 'fastify';
import { PROBLEM_CONTENT_TYPE, type ProblemException } from '../common/problem.js';
import type { StoredResponse } from './idempotency-keys.service.js';

const JSON_CONTENT_TYPE = 'application/json; charset=utf-8';

/** A JSON answer as it is stored under a key and sent: the exact body bytes a replay sends again. */
export function jsonResponse(status: number, body: unknown, headers: Record<string, string> = {}): StoredResponse {
  return { status, headers: { 'content-type': JSON_CONTENT_TYPE, ...lowerCased(headers) }, body: JSON.stringify(body) };
}

/** A business problem as it is stored under a key (402, 404, 409, 422), byte for byte what the filter would send. */
export function problemResponse(problem: ProblemException): StoredResponse {
  return {
    status: problem.problem.status,
    headers: { ...lowerCased(problem.headers), 'content-type': `${PROBLEM_CONTENT_TYPE}; charset=utf-8` },
    body: JSON.stringify(problem.problem),
  };
}

/** Sends a stored answer; the caller returns `response.body` from the handler so Nest writes exactly those bytes. */
export function writeStoredResponse(res: FastifyReply, response: StoredResponse, replayed: boolean): string {
  res.status(response.status);
  for (const [name, value] of Object.entries(response.headers)) res.header(name, value);
  if (replayed) res.header('Idempotent-Replayed', 'true');
  return response.body;
}

function lowerCased(headers: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.entries(headers).map(([name, value]) => [name.toLowerCase(), value]));
}
