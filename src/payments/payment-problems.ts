import type { OrderStatus } from '../orders/order-status.js';
import { ProblemException } from '#service-kit';

import { PAYMENT_PENDING_RETRY_AFTER_SECONDS } from '../common/payment-in-progress.js';

export { PAYMENT_PENDING_RETRY_AFTER_SECONDS, paymentInProgress } from '../common/payment-in-progress.js';

export function paymentNotFound(id: string): ProblemException {
  return ProblemException.of(404, 'payment-not-found', 'Payment not found', `There is no payment ${id}.`);
}

export function refundNotFound(id: string): ProblemException {
  return ProblemException.of(404, 'refund-not-found', 'Refund not found', `There is no refund ${id}.`);
}

export function orderNotPayable(orderId: string, currentStatus: OrderStatus): ProblemException {
  return ProblemException.of(
    409,
    'order-not-payable',
    'Order cannot be paid',
    `Order ${orderId} is ${currentStatus}: only a created order can be paid.`,
    {
      orderId,
      currentStatus,
    },
  );
}

export function nothingToPay(orderId: string): ProblemException {
  return ProblemException.of(409, 'nothing-to-pay', 'Nothing to pay', `Order ${orderId} totals 0.`, { orderId });
}

/** The charge breaker is open: nothing was written, the key is free. */
export function providerUnavailable(retryAfterSeconds: number): ProblemException {
  return ProblemException.of(
    503,
    'provider-unavailable',
    'Payment provider unavailable',
    'The payment provider is failing; nothing was charged or recorded. Retry later with the same Idempotency-Key.',
    {},
    { 'Retry-After': String(Math.max(1, retryAfterSeconds)) },
  );
}

/**
 * The provider's answer is not known (timeouts, 5xx): the payment stays pending and is NOT failed,
 * because the card may have been charged. A retry with the same key asks the provider again with the same outbound key.
 */
export function paymentPending(paymentId: string, what: 'payment' | 'refund' = 'payment'): ProblemException {
  return ProblemException.of(
    503,
    `${what}-pending`,
    what === 'payment' ? 'Payment outcome not known yet' : 'Refund outcome not known yet',
    `The provider has not confirmed ${what} ${paymentId} yet. Retry with the same Idempotency-Key: it resumes and never charges twice.`,
    { [`${what}Id`]: paymentId },
    { 'Retry-After': String(PAYMENT_PENDING_RETRY_AFTER_SECONDS) },
  );
}

export function paymentDeclined(paymentId: string, failureCode: string): ProblemException {
  return ProblemException.of(402, 'payment-declined', 'Payment declined', `Payment ${paymentId} failed: ${failureCode}.`, {
    paymentId,
    failureCode,
  });
}

export function refundDeclined(refundId: string, paymentId: string, failureCode: string): ProblemException {
  return ProblemException.of(402, 'refund-declined', 'Refund declined', `Refund ${refundId} failed: ${failureCode}.`, {
    refundId,
    paymentId,
    failureCode,
  });
}

export function refundNotAllowed(paymentId: string, paymentStatus: string, orderStatus: OrderStatus): ProblemException {
  return ProblemException.of(
    409,
    'refund-not-allowed',
    'Refund not allowed',
    `Payment ${paymentId} is ${paymentStatus} and its order is ${orderStatus}: only a succeeded payment of a cancelled order can be refunded.`,
    { paymentId, paymentStatus, orderStatus },
  );
}

export function refundExceedsPayment(paymentId: string, requested: number, refundable: number): ProblemException {
  return ProblemException.of(
    422,
    'refund-exceeds-payment',
    'Refund exceeds the payment',
    `Payment ${paymentId} has ${refundable} minor units left to refund; ${requested} were asked for.`,
    { paymentId, requestedMinor: requested, refundableMinor: refundable },
  );
}
