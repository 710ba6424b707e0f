import { applyDecorators } from '@nestjs/common';
import { ApiHeader, ApiResponse } from '@nestjs/swagger';
import { ApiProblems } from '../common/api-problem-responses.js';
import { IDEMPOTENCY_KEY_HEADER } from '../idempotency/idempotency-key-header.js';

/** The Idempotency-Key contract of a phased (external side effect) endpoint, for the OpenAPI document. */
export function ApiPhasedIdempotencyKey() {
  return applyDecorators(
    ApiHeader({
      name: IDEMPOTENCY_KEY_HEADER,
      required: true,
      description:
        'A unique value per operation (a UUID is best). Retrying with the same key and body never charges twice: a finished request replays its answer ' +
        '(Idempotent-Replayed: true); one whose outcome is not known yet (503) is resumed and the provider asked again under the same outbound key. ' +
        'While the first request is still running, the key answers 409 with Retry-After. Keys of finished requests are kept IDEMPOTENCY_TTL_SECONDS.',
      schema: { type: 'string', maxLength: 255, example: '0c6d0f5a-1f7b-4b8e-9a43-7d2b1f7f6a11' },
    }),
    ApiResponse({
      status: 'default',
      description: 'Any stored answer replayed for a repeated Idempotency-Key carries Idempotent-Replayed: true.',
      headers: { 'Idempotent-Replayed': { description: 'true when this is the stored answer of an earlier request with the same key', schema: { type: 'string', enum: ['true'] } } },
    }),
    ApiProblems(
      {
        status: 400,
        description: 'Idempotency-Key missing or malformed, or the body is invalid. Nothing was written; the key stays free.',
        example: { type: 'urn:idempotent-orders:problem:idempotency-key-missing', title: 'Idempotency-Key is missing', status: 400, detail: 'This operation requires an Idempotency-Key header.' },
      },
      {
        status: 409,
        description: 'A request with this Idempotency-Key is still running (its lease has not run out). Retry after Retry-After seconds.',
        headers: { 'Retry-After': { description: 'seconds', schema: { type: 'string' } } },
        example: { type: 'urn:idempotent-orders:problem:idempotency-key-in-use', title: 'A request is outstanding for this Idempotency-Key', status: 409, detail: 'A request with this key is still being processed.' },
      },
      {
        status: 422,
        description: 'This Idempotency-Key was used for a different request. Nothing was executed.',
        example: { type: 'urn:idempotent-orders:problem:idempotency-key-reused', title: 'Idempotency-Key is already used', status: 422, detail: 'This key was first used for a different request; use a new key for a new request.' },
      },
    ),
  );
}
