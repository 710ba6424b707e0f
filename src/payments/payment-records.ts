import { jsonResponse, problemResponse, type StoredResponse } from '@idempotent-orders/idempotency';
import type { PaymentView } from './dto/payment.view.js';
import type { RefundView } from './dto/refund.view.js';
import type { PaymentStatus } from './payment.entity.js';
import { paymentDeclined, refundDeclined } from './payment-problems.js';

/** Recovery point of a payment key: the pending payment and its outbound key are committed; the provider is next. */
export const PAYMENT_CREATED = 'payment_created';
/** Recovery point of a refund key: the pending refund, its reservation and its outbound key are committed. */
export const REFUND_CREATED = 'refund_created';

export interface PaymentRow {
  id: string;
  client_id: string;
  order_id: string;
  idempotency_key_id: string | null;
  status: PaymentStatus;
  amount_minor: string;
  currency: string;
  source: string;
  provider: string;
  provider_transaction_id: string | null;
  outbound_key: string;
  refunded_minor: string;
  failure_code: string | null;
  created_at: Date;
  updated_at: Date;
}

export interface RefundRow {
  id: string;
  client_id: string;
  payment_id: string;
  idempotency_key_id: string | null;
  status: PaymentStatus;
  amount_minor: string;
  provider: string;
  provider_refund_id: string | null;
  outbound_key: string;
  failure_code: string | null;
  created_at: Date;
  updated_at: Date;
}

/**
 * The columns of PaymentRow and RefundRow, named: a statement that reads `*` changes its result's shape when a
 * migration adds a column, and a prepared statement then fails until its connection is dropped.
 */
export const PAYMENT_COLUMNS =
  'id, client_id, order_id, idempotency_key_id, status, amount_minor, currency, source, provider, provider_transaction_id, outbound_key, refunded_minor, failure_code, created_at, updated_at';
export const REFUND_COLUMNS =
  'id, client_id, payment_id, idempotency_key_id, status, amount_minor, provider, provider_refund_id, outbound_key, failure_code, created_at, updated_at';

/** `a.id, a.status, …`: a column list read through a table alias. */
export const prefixed = (alias: string, columns: string) =>
  columns
    .split(',')
    .map((c) => `${alias}.${c.trim()}`)
    .join(', ');

export function toPaymentView(row: PaymentRow): PaymentView {
  return {
    id: row.id,
    orderId: row.order_id,
    status: row.status,
    amountMinor: Number(row.amount_minor),
    currency: row.currency,
    provider: row.provider,
    providerTransactionId: row.provider_transaction_id,
    refundedMinor: Number(row.refunded_minor),
    failureCode: row.failure_code,
    createdAt: row.created_at.toISOString(),
    updatedAt: row.updated_at.toISOString(),
  };
}

export function toRefundView(row: RefundRow): RefundView {
  return {
    id: row.id,
    paymentId: row.payment_id,
    amountMinor: Number(row.amount_minor),
    status: row.status,
    providerRefundId: row.provider_refund_id,
    failureCode: row.failure_code,
    createdAt: row.created_at.toISOString(),
  };
}

/**
 * The answer POST /orders/:id/payments gives for a settled payment — whoever settled it (the
 * request, a retry, the reconciler, a webhook) stores exactly this under the request's key.
 */
export function paymentAnswer(row: PaymentRow): StoredResponse {
  if (row.status === 'succeeded') return jsonResponse(201, toPaymentView(row), { Location: `/payments/${row.id}` });
  return problemResponse(paymentDeclined(row.id, row.failure_code ?? 'unknown'));
}

/** Likewise for POST /payments/:id/refunds. */
export function refundAnswer(row: RefundRow): StoredResponse {
  if (row.status === 'succeeded') return jsonResponse(201, toRefundView(row), { Location: `/refunds/${row.id}` });
  return problemResponse(refundDeclined(row.id, row.payment_id, row.failure_code ?? 'unknown'));
}

/** The provider's dedupe key for a payment or refund: derived from its id, stored with it before the first attempt. */
export const outboundKeyOf = (kind: 'payment' | 'refund', id: string) => `${kind}_${id}`;
