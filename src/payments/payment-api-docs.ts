import { applyDecorators } from '@nestjs/common';
import { ApiHeader, ApiResponse, type SchemaObject } from '@nestjs/swagger';
import { IDEMPOTENCY_KEY_HEADER, IDEMPOTENT_REPLAYED_HEADER } from '@idempotent-orders/idempotency';
import { IDEMPOTENCY_KEY_EXAMPLES } from '../common/idempotent-endpoint.js';
import { ORDER_STATUSES } from '../orders/order-status.js';
import { PAYMENT_STATUSES } from './dto/payment.view.js';
import { ApiProblems, type ProblemExample } from '#service-kit';

const EXAMPLE_ORDER_ID = '6f1c2d0e-5b7a-4c3e-9f8d-2a1b0c9d8e7f';
const EXAMPLE_PAYMENT_ID = '9b2e4c1a-7d3f-4e8b-a6c5-0f1e2d3c4b5a';
const EXAMPLE_REFUND_ID = '1d4a8e2b-3c5f-4a7d-9e1b-6c8d0f2a4b6e';
const RETRY_AFTER = {
  'Retry-After': { description: 'Seconds to wait before retrying with the same Idempotency-Key.', schema: { type: 'string' } },
};

const PAYMENT_ID: SchemaObject = { type: 'string', format: 'uuid', description: 'The payment this problem is about.' };
const REFUND_ID: SchemaObject = { type: 'string', format: 'uuid', description: 'The refund this problem is about.' };
const ORDER_ID: SchemaObject = { type: 'string', format: 'uuid', description: 'The order this problem is about.' };
const FAILURE_CODE: SchemaObject = {
  type: 'string',
  description:
    'Why it failed: card_declined, refund_declined, invalid_source (the provider refused the source), provider_unreachable (the provider never saw it), provider_refused.',
};

export const PAYMENT_NOT_FOUND: ProblemExample = {
  status: 404,
  description: 'No such payment for this client.',
  example: {
    type: 'urn:idempotent-orders:problem:payment-not-found',
    title: 'Payment not found',
    status: 404,
    detail: `There is no payment ${EXAMPLE_PAYMENT_ID}.`,
  },
};

export const REFUND_NOT_FOUND: ProblemExample = {
  status: 404,
  description: 'No such refund for this client.',
  example: {
    type: 'urn:idempotent-orders:problem:refund-not-found',
    title: 'Refund not found',
    status: 404,
    detail: `There is no refund ${EXAMPLE_REFUND_ID}.`,
  },
};

export const PAYMENT_DECLINED: ProblemExample = {
  status: 402,
  description:
    'The provider declined the charge, refused the source, or never saw it (decided by the reconciler). Final and stored under the key; a new key may pay again.',
  example: {
    type: 'urn:idempotent-orders:problem:payment-declined',
    title: 'Payment declined',
    status: 402,
    detail: `Payment ${EXAMPLE_PAYMENT_ID} failed: card_declined.`,
    paymentId: EXAMPLE_PAYMENT_ID,
    failureCode: 'card_declined',
  },
  members: { paymentId: PAYMENT_ID, failureCode: FAILURE_CODE },
};

export const ORDER_NOT_PAYABLE: ProblemExample = {
  status: 409,
  description: 'Only a created order can be paid. Stored under the key.',
  example: {
    type: 'urn:idempotent-orders:problem:order-not-payable',
    title: 'Order cannot be paid',
    status: 409,
    detail: `Order ${EXAMPLE_ORDER_ID} is paid: only a created order can be paid.`,
    orderId: EXAMPLE_ORDER_ID,
    currentStatus: 'paid',
  },
  members: {
    orderId: ORDER_ID,
    currentStatus: { type: 'string', enum: [...ORDER_STATUSES], description: 'The status the order is in now.' },
  },
};

export const NOTHING_TO_PAY: ProblemExample = {
  status: 409,
  description: 'The order totals 0. Stored under the key.',
  example: {
    type: 'urn:idempotent-orders:problem:nothing-to-pay',
    title: 'Nothing to pay',
    status: 409,
    detail: `Order ${EXAMPLE_ORDER_ID} totals 0.`,
    orderId: EXAMPLE_ORDER_ID,
  },
  members: { orderId: ORDER_ID },
};

/** Also sent by POST /orders/:id/cancel while a payment of the order is pending. */
export const PAYMENT_IN_PROGRESS: ProblemExample = {
  status: 409,
  description: 'A payment of this order is still pending (its outcome is being decided). Temporary: not stored; retry after Retry-After.',
  headers: RETRY_AFTER,
  example: {
    type: 'urn:idempotent-orders:problem:payment-in-progress',
    title: 'A payment of this order is in progress',
    status: 409,
    detail: `Payment ${EXAMPLE_PAYMENT_ID} of this order is still pending. Retry after it has settled.`,
    paymentId: EXAMPLE_PAYMENT_ID,
  },
  members: { paymentId: PAYMENT_ID },
};

export const PROVIDER_UNAVAILABLE: ProblemExample = {
  status: 503,
  description: 'The payment provider is failing (its circuit breaker is open): nothing was written, the key is free. Not stored.',
  headers: RETRY_AFTER,
  example: {
    type: 'urn:idempotent-orders:problem:provider-unavailable',
    title: 'Payment provider unavailable',
    status: 503,
    detail: 'The payment provider is failing; nothing was charged or recorded. Retry later with the same Idempotency-Key.',
  },
};

export const PAYMENT_PENDING: ProblemExample = {
  status: 503,
  description:
    'The provider has not told us the outcome (timeouts, 5xx). The payment stays pending — it may have been charged. Not stored: retry with the same key, which resumes and asks the provider again under the same outbound key.',
  headers: RETRY_AFTER,
  example: {
    type: 'urn:idempotent-orders:problem:payment-pending',
    title: 'Payment outcome not known yet',
    status: 503,
    detail: `The provider has not confirmed payment ${EXAMPLE_PAYMENT_ID} yet. Retry with the same Idempotency-Key: it resumes and never charges twice.`,
    paymentId: EXAMPLE_PAYMENT_ID,
  },
  members: { paymentId: PAYMENT_ID },
};

export const REFUND_PENDING: ProblemExample = {
  status: 503,
  description: 'The provider has not told us the outcome of the refund. Not stored: retry with the same key.',
  headers: RETRY_AFTER,
  example: {
    type: 'urn:idempotent-orders:problem:refund-pending',
    title: 'Refund outcome not known yet',
    status: 503,
    detail: `The provider has not confirmed refund ${EXAMPLE_REFUND_ID} yet. Retry with the same Idempotency-Key: it resumes and never charges twice.`,
    refundId: EXAMPLE_REFUND_ID,
  },
  members: { refundId: REFUND_ID },
};

export const REFUND_DECLINED: ProblemExample = {
  status: 402,
  description: 'The provider declined the refund; its reserved amount is given back. Stored under the key.',
  example: {
    type: 'urn:idempotent-orders:problem:refund-declined',
    title: 'Refund declined',
    status: 402,
    detail: `Refund ${EXAMPLE_REFUND_ID} failed: refund_declined.`,
    refundId: EXAMPLE_REFUND_ID,
    paymentId: EXAMPLE_PAYMENT_ID,
    failureCode: 'refund_declined',
  },
  members: { refundId: REFUND_ID, paymentId: PAYMENT_ID, failureCode: FAILURE_CODE },
};

export const REFUND_NOT_ALLOWED: ProblemExample = {
  status: 409,
  description: 'Only a succeeded payment of a cancelled order can be refunded. Stored under the key.',
  example: {
    type: 'urn:idempotent-orders:problem:refund-not-allowed',
    title: 'Refund not allowed',
    status: 409,
    detail: `Payment ${EXAMPLE_PAYMENT_ID} is succeeded and its order is paid: only a succeeded payment of a cancelled order can be refunded.`,
    paymentId: EXAMPLE_PAYMENT_ID,
    paymentStatus: 'succeeded',
    orderStatus: 'paid',
  },
  members: {
    paymentId: PAYMENT_ID,
    paymentStatus: { type: 'string', enum: [...PAYMENT_STATUSES], description: 'The payment status now.' },
    orderStatus: { type: 'string', enum: [...ORDER_STATUSES], description: 'The order status now.' },
  },
};

export const REFUND_EXCEEDS_PAYMENT: ProblemExample = {
  status: 422,
  description: 'More than remains refundable (refunds reserved or settled count). Stored under the key.',
  example: {
    type: 'urn:idempotent-orders:problem:refund-exceeds-payment',
    title: 'Refund exceeds the payment',
    status: 422,
    detail: `Payment ${EXAMPLE_PAYMENT_ID} has 500 minor units left to refund; 800 were asked for.`,
    paymentId: EXAMPLE_PAYMENT_ID,
    requestedMinor: 800,
    refundableMinor: 500,
  },
  members: {
    paymentId: PAYMENT_ID,
    requestedMinor: { type: 'integer', description: 'What was asked for.' },
    refundableMinor: { type: 'integer', description: 'What remained refundable when it was asked.' },
  },
};

/** The Idempotency-Key contract of a phased (external side effect) endpoint, for the OpenAPI document. */
export function ApiPhasedIdempotencyKey() {
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
        headers: RETRY_AFTER,
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
