import {
  applyDecorators,
  type CallHandler,
  type ExecutionContext,
  Injectable,
  type NestInterceptor,
  UseInterceptors,
} from '@nestjs/common';
import { ApiHeader, ApiResponse } from '@nestjs/swagger';
import { map, type Observable } from 'rxjs';
import {
  IDEMPOTENCY_KEY_HEADER,
  IDEMPOTENT_REPLAYED_HEADER,
  Idempotent,
  type IdempotentOptions,
  type IdempotentReply,
  type StoredResponse,
  writeStoredResponse,
} from '@idempotent-orders/idempotency';
import { ApiProblems } from '#service-kit';

/** The Idempotency-Key problems as the OpenAPI document shows them; the phased (payment) endpoints document the same ones. */
export const IDEMPOTENCY_KEY_EXAMPLES = {
  MISSING: {
    type: 'urn:idempotent-orders:problem:idempotency-key-missing',
    title: 'Idempotency-Key is missing',
    status: 400,
    detail: 'This operation requires an Idempotency-Key header.',
  },
  MALFORMED: {
    type: 'urn:idempotent-orders:problem:idempotency-key-malformed',
    title: 'Idempotency-Key is malformed',
    status: 400,
    detail: 'Send exactly one Idempotency-Key header.',
  },
  IN_USE: {
    type: 'urn:idempotent-orders:problem:idempotency-key-in-use',
    title: 'A request is outstanding for this Idempotency-Key',
    status: 409,
    detail: 'Retry after the first request has finished.',
  },
  REUSED: {
    type: 'urn:idempotent-orders:problem:idempotency-key-reused',
    title: 'Idempotency-Key is already used',
    status: 422,
    detail: 'This key was first used for a different request; use a new key for a new request.',
  },
};

const ttlNote = 'Keys are remembered for IDEMPOTENCY_TTL_SECONDS (24 h by default), per API client.';

/** @Idempotent() (the layer) and what the OpenAPI document says of it: the header, the replay marker, the key's problems. */
export function IdempotentEndpoint(options: IdempotentOptions = { required: true }) {
  return applyDecorators(
    Idempotent(options),
    ApiHeader({
      name: IDEMPOTENCY_KEY_HEADER,
      required: options.required,
      description:
        `A unique value per operation (a UUID is best): 1–255 visible ASCII characters, bare or as an RFC 8941 string ("…"). ` +
        `Retrying with the same key and body replays the first response. Editing the body (any field) and sending it under the same key ` +
        `is a 422 and nothing runs: a changed request needs a new key. ` +
        `A retry while the first request is still running waits for it (up to IDEMPOTENCY_WAIT_MS), else 409 with Retry-After. ` +
        `Validation errors (400) and server errors are not stored: fix and retry with the same key. ${ttlNote}`,
      schema: { type: 'string', maxLength: 255, example: '8e03978e-40d5-43e8-bc93-6894a57f9324' },
    }),
    ApiResponse({
      status: 'default',
      description: `Any stored response replayed for a repeated Idempotency-Key carries ${IDEMPOTENT_REPLAYED_HEADER}: true.`,
      headers: {
        [IDEMPOTENT_REPLAYED_HEADER]: {
          description: 'true when this is the stored response of an earlier request with the same key',
          schema: { type: 'string', enum: ['true'] },
        },
      },
    }),
    ApiProblems(
      ...(options.required
        ? [
            {
              status: 400,
              description: 'Idempotency-Key missing (or the body is invalid; not stored, the key stays free).',
              example: IDEMPOTENCY_KEY_EXAMPLES.MISSING,
            },
          ]
        : []),
      {
        status: 400,
        description: 'Idempotency-Key malformed (or the body is invalid; not stored, the key stays free).',
        example: IDEMPOTENCY_KEY_EXAMPLES.MALFORMED,
      },
      {
        status: 409,
        description: 'A request with this Idempotency-Key is still running. Retry after Retry-After seconds.',
        headers: { 'Retry-After': { description: 'seconds', schema: { type: 'string' } } },
        example: IDEMPOTENCY_KEY_EXAMPLES.IN_USE,
      },
      {
        status: 422,
        description: 'This Idempotency-Key was used for a different request (other body, method or endpoint). Nothing was executed.',
        example: IDEMPOTENCY_KEY_EXAMPLES.REUSED,
      },
    ),
  );
}

/** What a phased handler returns: the answer stored under its key, and whether it is a replay of an earlier request's. */
export interface KeyAnswer {
  response: StoredResponse;
  replayed: boolean;
}

/** Sends the KeyAnswer a phased handler returns exactly as stored, as the layer's interceptor sends its own answers. */
@Injectable()
export class KeyAnswerInterceptor implements NestInterceptor {
  intercept(context: ExecutionContext, next: CallHandler<KeyAnswer>): Observable<string> {
    const res = context.switchToHttp().getResponse<IdempotentReply>();
    return next.handle().pipe(map((answer) => writeStoredResponse(res, answer.response, answer.replayed)));
  }
}

/**
 * IdempotentEndpoint for a handler with an external side effect (a provider call), which the layer's interceptor
 * cannot serve: it runs the handler inside ONE transaction with the key, and a provider call must run outside any
 * transaction, after the key and the pending record have committed. Such a handler runs its phases itself
 * (AtomicPhases, docs/patterns/phased-external-calls.md) and returns the KeyAnswer; this sends it byte for byte, with
 * Idempotent-Replayed on a replay, and documents the key the same way.
 */
export function PhasedIdempotentEndpoint() {
  return applyDecorators(UseInterceptors(KeyAnswerInterceptor), ApiPhasedIdempotencyKey());
}

/** The Idempotency-Key contract of a phased (external side effect) endpoint, for the OpenAPI document. */
function ApiPhasedIdempotencyKey() {
  return applyDecorators(
    ApiHeader({
      name: IDEMPOTENCY_KEY_HEADER,
      required: true,
      description:
        'A unique value per operation (a UUID is best). Retrying with the same key and body never charges twice: a finished request replays its answer ' +
        '(Idempotent-Replayed: true); one whose outcome is not known yet (503) is resumed and the provider asked again under the same outbound key. ' +
        'Another body (or another order or payment in the path) under the same key is a 422 and nothing is charged: a changed request needs a new key. ' +
        'While the first request is still running, the key answers 409 with Retry-After. Keys of finished requests are kept IDEMPOTENCY_TTL_SECONDS.',
      schema: { type: 'string', maxLength: 255, example: '0c6d0f5a-1f7b-4b8e-9a43-7d2b1f7f6a11' },
    }),
    ApiResponse({
      status: 'default',
      description: 'Any stored answer replayed for a repeated Idempotency-Key carries Idempotent-Replayed: true.',
      headers: {
        [IDEMPOTENT_REPLAYED_HEADER]: {
          description: 'true when this is the stored answer of an earlier request with the same key',
          schema: { type: 'string', enum: ['true'] },
        },
      },
    }),
    ApiProblems(
      {
        status: 400,
        description: 'Idempotency-Key missing or malformed, or the body is invalid. Nothing was written; the key stays free.',
        example: IDEMPOTENCY_KEY_EXAMPLES.MISSING,
      },
      {
        status: 400,
        description: 'Idempotency-Key malformed: not 1–255 visible ASCII characters, or sent twice. Nothing was written.',
        example: IDEMPOTENCY_KEY_EXAMPLES.MALFORMED,
      },
      {
        status: 409,
        description:
          'A request with this Idempotency-Key is still running (its lease has not run out). Retry after Retry-After seconds: a retry after the lease resumes it.',
        headers: {
          'Retry-After': { description: 'Seconds to wait before retrying with the same Idempotency-Key.', schema: { type: 'string' } },
        },
        example: IDEMPOTENCY_KEY_EXAMPLES.IN_USE,
      },
      {
        status: 422,
        description: 'This Idempotency-Key was used for a different request. Nothing was executed.',
        example: IDEMPOTENCY_KEY_EXAMPLES.REUSED,
      },
    ),
  );
}
