import { applyDecorators } from '@nestjs/common';
import { ApiHeader, ApiResponse } from '@nestjs/swagger';
import { IDEMPOTENCY_KEY_HEADER, IDEMPOTENT_REPLAYED_HEADER, Idempotent, type IdempotentOptions } from '@idempotent-orders/idempotency';
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
