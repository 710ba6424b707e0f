import { Inject, Injectable } from '@nestjs/common';
import { IDEMPOTENCY_OPTIONS, type IdempotentRequest, type ResolvedIdempotencyOptions } from './idempotency-options.js';
import type { KeyScope } from './idempotency-keys.service.js';
import { parseIdempotencyKey } from './idempotency-key-header.js';
import { ProblemDetailsException } from './problem-details.js';
import { fingerprintRequest, normalisePath } from './request-fingerprint.js';

/**
 * The problems of the Idempotency-Key contract, one shape for the
 * interceptor and the atomic phases; their `type` is the app's (IdempotencyModuleOptions.problemType).
 */
@Injectable()
export class IdempotencyProblems {
  constructor(@Inject(IDEMPOTENCY_OPTIONS) private readonly options: ResolvedIdempotencyOptions) {}

  keyMissing(): ProblemDetailsException {
    return this.problem(400, 'idempotency-key-missing', 'Idempotency-Key is missing', 'This operation requires an Idempotency-Key header.');
  }

  keyReused(): ProblemDetailsException {
    return this.problem(
      422,
      'idempotency-key-reused',
      'Idempotency-Key is already used',
      'This key was first used for a different request (body, method or endpoint). Nothing was executed; use a new key for a new request.',
    );
  }

  keyInUse(detail: string, retryAfterSeconds: number): ProblemDetailsException {
    return this.problem(409, 'idempotency-key-in-use', 'A request is outstanding for this Idempotency-Key', detail, {
      'Retry-After': String(retryAfterSeconds),
    });
  }

  /** No caller to scope the key to: refused before anything runs. */
  callerUnknown(): ProblemDetailsException {
    return this.problem(
      401,
      'caller-unknown',
      'Caller unknown',
      'An idempotent operation needs an authenticated caller: keys are scoped to their caller.',
    );
  }

  /** The request's key (parsed: a malformed one is a 400), scoped to its caller and bound to the request. */
  scopeOf(req: IdempotentRequest, raw: string | string[], boundHeaders: readonly string[] = []): KeyScope {
    const clientId = this.options.callerScope(req);
    if (clientId === undefined) throw this.callerUnknown();
    return keyScopeOf(req, clientId, parseIdempotencyKey(raw, this.options.problemType), boundHeaders);
  }

  private problem(
    status: number,
    slug: string,
    title: string,
    detail: string,
    headers: Record<string, string> = {},
  ): ProblemDetailsException {
    return new ProblemDetailsException({ type: this.options.problemType(slug), title, status, detail }, headers);
  }
}

/**
 * What a key is scoped to (its client) and bound to (method, concrete path, canonical body, and the
 * `boundHeaders` the route names, absent counted as empty).
 */
export function keyScopeOf(req: IdempotentRequest, clientId: string, key: string, boundHeaders: readonly string[] = []): KeyScope {
  const path = normalisePath(req.originalUrl.split('?')[0]);
  const headers = Object.fromEntries(boundHeaders.map((name) => [name, String(req.headers[name.toLowerCase()] ?? '').trim()]));
  return { clientId, key, method: req.method, path, fingerprint: fingerprintRequest(req.method, path, req.body, headers) };
}
