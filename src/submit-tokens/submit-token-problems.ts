import { ProblemException } from '#service-kit';

/** One answer for unknown, expired and another client's: nothing tells a caller whether a token exists. */
export function submitTokenInvalid(): ProblemException {
  return ProblemException.of(
    422,
    'submit-token-invalid',
    'Submit token is not valid',
    'This submit token is unknown, expired or was issued to another client. Nothing was created; get a new one with POST /submit-tokens.',
  );
}

/** `orderId` is null only if the order was deleted since (the foreign key is ON DELETE SET NULL). */
export function submitTokenUsed(orderId: string | null): ProblemException {
  return ProblemException.of(
    409,
    'submit-token-used',
    'Submit token already used',
    orderId
      ? `This submit token already created order ${orderId}; nothing new was created.`
      : 'This submit token was already used; nothing new was created.',
    { orderId },
  );
}

/** Both headers: which of the two should decide would be a guess. */
export function submitTokenWithIdempotencyKey(): ProblemException {
  return ProblemException.of(
    400,
    'idempotency-key-and-submit-token',
    'Idempotency-Key and Submit-Token together',
    'Send either an Idempotency-Key or a Submit-Token header, not both.',
  );
}

/** The interceptor's problem for a missing key (same type and title), naming the second option. */
export function idempotencyKeyOrSubmitTokenMissing(): ProblemException {
  return ProblemException.of(
    400,
    'idempotency-key-missing',
    'Idempotency-Key is missing',
    'Creating an order needs an Idempotency-Key header (a unique value such as a UUID) or a Submit-Token header (from POST /submit-tokens).',
  );
}
