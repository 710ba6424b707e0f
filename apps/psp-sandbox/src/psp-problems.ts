import { TEST_TOKEN_NAMES } from './test-tokens.js';
import { type ProblemExample, ProblemException, VALIDATION_FAILED } from '#service-kit';

/** The sandbox's refusals. Its 503s carry no Retry-After: a client must choose its own backoff (docs/contract.md#sandbox-provider). */
export const pspUnavailable = () =>
  ProblemException.of(
    503,
    'psp-unavailable',
    'Provider unavailable',
    'The provider could not process the request; nothing was recorded. Retry with the same Idempotency-Key.',
  );

/** No key, or not the provider's: nothing is read or recorded. The type is the service's own 401's. */
export const providerKeyRefused = (detail: string) =>
  ProblemException.of(401, 'unauthorized', 'Unauthorized', detail, {}, { 'WWW-Authenticate': 'Bearer' });

export const unknownSource = (source: string) =>
  ProblemException.of(
    400,
    'psp-unknown-source',
    'Unknown payment source',
    `${JSON.stringify(source.slice(0, 64))} is not a test token; use one of ${TEST_TOKEN_NAMES.join(', ')}.`,
  );

export const keyMissing = () =>
  ProblemException.of(
    400,
    'idempotency-key-missing',
    'Idempotency-Key is missing',
    'The provider requires an Idempotency-Key header on every charge and refund.',
  );

export const keyReused = () =>
  ProblemException.of(
    422,
    'psp-idempotency-key-reused',
    'Idempotency-Key is already used',
    'This key was first used for a different request; use a new key for a new request. Nothing was recorded.',
  );

export const chargeNotFound = (chargeId: string) =>
  ProblemException.of(404, 'psp-charge-not-found', 'Charge not found', `There is no charge ${chargeId}.`);

export const chargeNotRefundable = (chargeId: string) =>
  ProblemException.of(
    422,
    'psp-charge-not-refundable',
    'Charge cannot be refunded',
    `Charge ${chargeId} failed: it took no money to give back.`,
  );

export const refundExceedsCharge = (chargeId: string, remainingMinor: number) =>
  ProblemException.of(
    422,
    'psp-refund-exceeds-charge',
    'Refund exceeds the charge',
    `Only ${remainingMinor} of charge ${chargeId} remains refundable.`,
    { remainingMinor },
  );

/** A lookup with no filter would list every charge (or refund) at once: refused like any other invalid query. */
export const lookupNeedsFilter = (fields: string[]) => {
  const anyOf = `${fields.slice(0, -1).join(', ')} or ${fields.at(-1)}`;
  return ProblemException.of(400, 'validation-failed', 'Validation failed', `Give ${anyOf}.`, {
    errors: fields.map((field) => ({ field, messages: [`${anyOf} is required`] })),
  });
};

/** A query the validator passed field by field that is still wrong as a whole: the validator's 400, naming `field`. */
export const invalidQuery = (field: string, message: string) =>
  ProblemException.of(400, 'validation-failed', 'Validation failed', `${field}: ${message}`, {
    errors: [{ field, messages: [message] }],
  });

const KEY_MISSING: ProblemExample = {
  status: 400,
  description: 'No Idempotency-Key header. Nothing recorded.',
  example: {
    type: 'urn:idempotent-orders:problem:idempotency-key-missing',
    title: 'Idempotency-Key is missing',
    status: 400,
    detail: 'The provider requires an Idempotency-Key header on every charge and refund.',
  },
};
const KEY_MALFORMED: ProblemExample = {
  status: 400,
  description: 'The Idempotency-Key is not 1–255 visible ASCII characters, or was sent twice. Nothing recorded.',
  example: {
    type: 'urn:idempotent-orders:problem:idempotency-key-malformed',
    title: 'Idempotency-Key is malformed',
    status: 400,
    detail: 'Send exactly one Idempotency-Key header.',
  },
};

/** For the OpenAPI document. */
export const PSP_PROBLEMS = {
  unauthorized: {
    status: 401,
    description: "No provider key, or another one (a client's API key is not it). Nothing read or recorded.",
    example: {
      type: 'urn:idempotent-orders:problem:unauthorized',
      title: 'Unauthorized',
      status: 401,
      detail: 'The provider key is not valid.',
    },
  },
  unknownSource: {
    status: 400,
    description: 'An unknown test token. Nothing recorded.',
    example: {
      type: 'urn:idempotent-orders:problem:psp-unknown-source',
      title: 'Unknown payment source',
      status: 400,
      detail: '"tok_nope" is not a test token; use one of tok_visa, tok_chargeDeclined, ….',
    },
  },
  invalid: { ...VALIDATION_FAILED, description: 'An invalid body or query. Nothing recorded.' },
  keyMissing: KEY_MISSING,
  keyMalformed: KEY_MALFORMED,
  keyReused: {
    status: 422,
    description: 'The same Idempotency-Key with another body. Nothing recorded.',
    example: {
      type: 'urn:idempotent-orders:problem:psp-idempotency-key-reused',
      title: 'Idempotency-Key is already used',
      status: 422,
      detail: 'This key was first used for a different request; use a new key for a new request. Nothing was recorded.',
    },
  },
  unavailable: {
    status: 503,
    description: 'tok_unavailable always, tok_flaky on the first 2 attempts per key. Nothing recorded; no Retry-After.',
    example: {
      type: 'urn:idempotent-orders:problem:psp-unavailable',
      title: 'Provider unavailable',
      status: 503,
      detail: 'The provider could not process the request; nothing was recorded. Retry with the same Idempotency-Key.',
    },
  },
  chargeNotFound: {
    status: 404,
    description: 'No such charge.',
    example: {
      type: 'urn:idempotent-orders:problem:psp-charge-not-found',
      title: 'Charge not found',
      status: 404,
      detail: 'There is no charge ch_5f0c3e2a1b9d8c7e6f5a4b3c.',
    },
  },
  refundExceedsCharge: {
    status: 422,
    description: 'The amount exceeds what remains refundable. Nothing recorded.',
    example: {
      type: 'urn:idempotent-orders:problem:psp-refund-exceeds-charge',
      title: 'Refund exceeds the charge',
      status: 422,
      detail: 'Only 500 of charge ch_5f0c3e2a1b9d8c7e6f5a4b3c remains refundable.',
      remainingMinor: 500,
    },
    members: { remainingMinor: { type: 'integer', minimum: 0, description: 'What remains refundable, in minor units.' } },
  },
  chargeNotRefundable: {
    status: 422,
    description: 'The charge failed: it took no money to give back. Nothing recorded.',
    example: {
      type: 'urn:idempotent-orders:problem:psp-charge-not-refundable',
      title: 'Charge cannot be refunded',
      status: 422,
      detail: 'Charge ch_5f0c3e2a1b9d8c7e6f5a4b3c failed: it took no money to give back.',
    },
  },
} satisfies Record<string, ProblemExample>;
