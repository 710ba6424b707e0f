import { Injectable } from '@nestjs/common';
import { isUUID } from 'class-validator';
import { Database, type KeyScope } from '@idempotent-orders/idempotency';
import type { OrderStatus } from '../orders/order-status.js';
import { PspClient } from '../psp-client/psp-client.js';
import type { RefundView } from './dto/refund.view.js';
import { paymentNotFound, refundExceedsPayment, refundNotAllowed, refundNotFound } from './payment-problems.js';
import {
  outboundKeyOf,
  PAYMENT_COLUMNS,
  type PaymentRow,
  prefixed,
  REFUND_COLUMNS,
  REFUND_CREATED,
  type RefundRow,
  toRefundView,
} from './payment-records.js';
import { PaymentSettlement } from './payment-settlement.js';
import { type KeyAnswer, PhasedOperation } from './phased-operation.js';
import { foundRefundOutcome, recordedOutcome, refundOutcome } from './provider-outcomes.js';
import { type ProblemException } from '#service-kit';

/**
 * Reserves $2 of payment $1's refundable amount: one conditional UPDATE, so refunds racing on one payment
 * can never reserve more than it holds (ck_payments_refunded_minor backs it). No row back: it would exceed.
 */
export const RESERVE_REFUND = `UPDATE payments SET refunded_minor = refunded_minor + $2, updated_at = now() WHERE id = $1 AND refunded_minor + $2 <= amount_minor RETURNING id`;

/**
 * POST /payments/:id/refunds, a PhasedOperation like a payment. The amount is reserved in
 * phase 1 by one conditional UPDATE (`refunded_minor + amount <= amount_minor`), so refunds racing
 * in parallel can never add up to more than was paid; a failed refund gives its reservation back.
 */
@Injectable()
export class RefundsService {
  constructor(
    private readonly db: Database,
    private readonly psp: PspClient,
    private readonly settlement: PaymentSettlement,
    private readonly phased: PhasedOperation,
  ) {}

  refundPayment(scope: KeyScope, paymentId: string, amountMinor: number | undefined): Promise<KeyAnswer> {
    return this.phased.run<RefundRow & { charge_id: string }>(scope, {
      table: 'refunds',
      created: REFUND_CREATED,
      create: (keyId) => this.createPendingRefund(scope.clientId, paymentId, amountMinor, keyId),
      load: (id) =>
        this.db.query<RefundRow & { charge_id: string }>(
          `SELECT ${prefixed('r', REFUND_COLUMNS)}, p.provider_transaction_id AS charge_id FROM refunds r JOIN payments p ON p.id = r.payment_id WHERE r.id = $1`,
          [id],
        ),
      find: (r) =>
        this.psp.findRefundsByRefund(r.id, { paymentId: r.payment_id, amountMinor: Number(r.amount_minor) }).then(foundRefundOutcome),
      send: (r, deadline, earlierAttempt) =>
        this.psp
          .createRefund(
            { chargeId: r.charge_id, amountMinor: Number(r.amount_minor), metadata: { refundId: r.id, paymentId: r.payment_id } },
            r.outbound_key,
            deadline,
          )
          .then((result) => refundOutcome(result, earlierAttempt)),
      recorded: (r) => recordedOutcome(r.status, r.provider_refund_id, r.failure_code),
      settle: (id, outcome, leaseToken) => this.settlement.settleRefund(id, outcome, leaseToken),
    });
  }

  /** Phase 1: order then payment locked (the one lock order), checked, the amount reserved, the refund inserted pending. */
  private async createPendingRefund(
    clientId: string,
    paymentId: string,
    amountMinor: number | undefined,
    keyId: string,
  ): Promise<{ row: RefundRow & { charge_id: string } } | { refusal: ProblemException }> {
    const [found] = isUUID(paymentId)
      ? await this.db.query<{ order_id: string }>(`SELECT order_id FROM payments WHERE id = $1 AND client_id = $2`, [paymentId, clientId])
      : [];
    if (!found) return { refusal: paymentNotFound(paymentId) };
    const [order] = await this.db.query<{ status: OrderStatus }>(`SELECT status FROM orders WHERE id = $1 FOR UPDATE`, [found.order_id]);
    const [payment] = await this.db.query<PaymentRow>(`SELECT ${PAYMENT_COLUMNS} FROM payments WHERE id = $1 FOR UPDATE`, [paymentId]);
    if (payment.status !== 'succeeded' || order.status !== 'cancelled')
      return { refusal: refundNotAllowed(paymentId, payment.status, order.status) };
    const refundable = Number(payment.amount_minor) - Number(payment.refunded_minor);
    const amount = amountMinor ?? refundable;
    const [reserved] = amount > 0 ? await this.db.query(RESERVE_REFUND, [paymentId, amount]) : [];
    if (!reserved) return { refusal: refundExceedsPayment(paymentId, amount, refundable) };
    const [refund] = await this.db.query<RefundRow>(
      `INSERT INTO refunds (id, client_id, payment_id, idempotency_key_id, amount_minor, outbound_key)
       SELECT g.id, $1, $2, $3, $4, $5 || g.id FROM (SELECT gen_random_uuid() AS id) g
       RETURNING ${REFUND_COLUMNS}`,
      [clientId, paymentId, keyId, amount, outboundKeyOf('refund', '')],
    );
    // The charge it refunds, as `load` joins it: a succeeded payment's charge never changes.
    return { row: { ...refund, charge_id: payment.provider_transaction_id! } };
  }

  async listPaymentRefunds(clientId: string, paymentId: string): Promise<RefundView[]> {
    if (!isUUID(paymentId)) throw paymentNotFound(paymentId);
    const rows = await this.db.query<RefundRow>(
      `SELECT ${prefixed('r', REFUND_COLUMNS)} FROM payments p LEFT JOIN refunds r ON r.payment_id = p.id WHERE p.id = $1 AND p.client_id = $2 ORDER BY r.created_at, r.id`,
      [paymentId, clientId],
    );
    if (rows.length === 0) throw paymentNotFound(paymentId);
    return rows.filter((r) => r.id !== null).map(toRefundView);
  }

  async findRefund(clientId: string, id: string): Promise<RefundView> {
    const [row] = isUUID(id)
      ? await this.db.query<RefundRow>(`SELECT ${REFUND_COLUMNS} FROM refunds WHERE id = $1 AND client_id = $2`, [id, clientId])
      : [];
    if (!row) throw refundNotFound(id);
    return toRefundView(row);
  }
}
