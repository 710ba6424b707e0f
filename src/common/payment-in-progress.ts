import { ProblemException, type ProblemExample } from '#service-kit';

/**
 * The one problem orders and payments share: an order whose payment is still being decided can neither be paid again
 * nor cancelled. It lives here, below both, so that orders never imports payments (payments imports orders).
 */

/**
 * How long a client should wait before asking again about a payment whose outcome is not known
 * yet. The provider is asked again on that retry (or by the reconciler); sooner rarely helps.
 */
export const PAYMENT_PENDING_RETRY_AFTER_SECONDS = 2;

/** Another payment of the order is still being decided: temporary, so never stored under a key. */
export function paymentInProgress(paymentId: string): ProblemException {
  return ProblemException.of(
    409,
    'payment-in-progress',
    'A payment of this order is in progress',
    `Payment ${paymentId} of this order is still pending. Retry after it has settled.`,
    { paymentId },
    { 'Retry-After': String(PAYMENT_PENDING_RETRY_AFTER_SECONDS) },
  );
}

const EXAMPLE_PAYMENT_ID = '9b2e4c1a-7d3f-4e8b-a6c5-0f1e2d3c4b5a';

/** paymentInProgress in the OpenAPI document: POST /orders/:id/payments and POST /orders/:id/cancel send it. */
export const PAYMENT_IN_PROGRESS: ProblemExample = {
  status: 409,
  description: 'A payment of this order is still pending (its outcome is being decided). Temporary: not stored; retry after Retry-After.',
  headers: {
    'Retry-After': { description: 'Seconds to wait before retrying with the same Idempotency-Key.', schema: { type: 'string' } },
  },
  example: {
    type: 'urn:idempotent-orders:problem:payment-in-progress',
    title: 'A payment of this order is in progress',
    status: 409,
    detail: `Payment ${EXAMPLE_PAYMENT_ID} of this order is still pending. Retry after it has settled.`,
    paymentId: EXAMPLE_PAYMENT_ID,
  },
  members: { paymentId: { type: 'string', format: 'uuid', description: 'The payment this problem is about.' } },
};
