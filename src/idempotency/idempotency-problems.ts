import type { FastifyRequest as Request } from 'fastify';
import { ProblemException } from '../common/problem.js';
import type { KeyScope } from './idempotency-keys.service.js';
import { fingerprintRequest, normalisePath } from './request-fingerprint.js';

/** The problems of the Idempotency-Key contract (docs/contract.md#idempotency-key), one shape for the interceptor and the atomic phases. */
export function keyMissing(): ProblemException {
  return ProblemException.of(400, 'idempotency-key-missing', 'Idempotency-Key is missing', 'This operation requires an Idempotency-Key header.');
}

export function keyReused(): ProblemException {
  return ProblemException.of(
    422,
    'idempotency-key-reused',
    'Idempotency-Key is already used',
    'This key was first used for a different request (body, method or endpoint). Nothing was executed; use a new key for a new request.',
  );
}

export function keyInUse(detail: string, retryAfterSeconds: number): ProblemException {
  return ProblemException.of(409, 'idempotency-key-in-use', 'A request is outstanding for this Idempotency-Key', detail, {}, { 'Retry-After': String(retryAfterSeconds) });
}

/**
 * What a key is scoped to (its client) and bound to (method, concrete path, canonical body, and the
 * `boundHeaders` the route names, absent counted as empty).
 */
export function keyScopeOf(req: Request, key: string, boundHeaders: readonly string[] = []): KeyScope {
  const path = normalisePath(req.originalUrl.split('?')[0]);
  const headers = Object.fromEntries(boundHeaders.map((name) => [name, String(req.headers[name.toLowerCase()] ?? '').trim()]));
  return { clientId: req.clientId!, key, method: req.method, path, fingerprint: fingerprintRequest(req.method, path, req.body, headers) };
}
