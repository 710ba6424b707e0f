import { Injectable } from '@nestjs/common';
import { isUUID } from 'class-validator';
import { Database, type KeyScope } from '@idempotent-orders/idempotency';
import { orderNotFound } from '../orders/orders.service.js';
import type { OrderStatus } from '../orders/order-status.js';
import { PspClient } from '../psp-client/psp-client.js';
import type { PaymentView } from './dto/payment.view.js';
import { nothingToPay, orderNotPayable, paymentInProgress, paymentNotFound } from './payment-problems.js';
import { outboundKeyOf, PAYMENT_COLUMNS, PAYMENT_CREATED, type PaymentRow, prefixed, toPaymentView } from './payment-records.js';
import { PaymentReconciler } from './payment-reconciler.js';
import { PaymentSettlement } from './payment-settlement.js';
import { type KeyAnswer, PhasedOperation, type PhasedSubject } from './phased-operation.js';
import { chargeOutcome, foundChargeOutcome, recordedOutcome } from './provider-outcomes.js';
import { ProblemException, problemType } from '#service-kit';

/**
 * POST /orders/:id/payments: the charge as a PhasedOperation (docs/patterns/phased-external-calls.md), with the payment as
 * its subject. Everything but what a payment is — the phases, the resume, the fencing — is PhasedOperation's.
 */
@Injectable()
export class PaymentsService {
  constructor(
    private readonly db: Database,
    private readonly psp: PspClient,
    private readonly settlement: PaymentSettlement,
    private readonly reconciler: PaymentReconciler,
    private readonly phased: PhasedOperation,
  ) {}

  async payOrder(scope: KeyScope, orderId: string, source: string): Promise<KeyAnswer> {
    try {
      return await this.phased.run(scope, this.paymentOf(scope.clientId, orderId, source));
    } catch (err) {
      // Another key's payment of this order is pending (only phase 1 says so). If its request is gone (lease run out), settle it first,
      // then try once more.
      const stale =
        err instanceof ProblemException &&
        err.problem.type === problemType('payment-in-progress') &&
        typeof err.problem.paymentId === 'string';
      if (!stale || !(await this.reconciler.reconcileStalePayment(err.problem.paymentId as string))) throw err;
      return this.phased.run(scope, this.paymentOf(scope.clientId, orderId, source));
    }
  }

  private paymentOf(clientId: string, orderId: string, source: string): PhasedSubject<PaymentRow> {
    return {
      table: 'payments',
      created: PAYMENT_CREATED,
      create: (keyId) => this.createPendingPayment(clientId, orderId, source, keyId),
      load: (id) => this.db.query<PaymentRow>(`SELECT ${PAYMENT_COLUMNS} FROM payments WHERE id = $1`, [id]),
      find: (p) =>
        this.psp.findChargesByPayment(p.id, { amountMinor: Number(p.amount_minor), currency: p.currency }).then(foundChargeOutcome),
      send: (p, deadline, earlierAttempt) =>
        this.psp
          .createCharge(
            {
              amountMinor: Number(p.amount_minor),
              currency: p.currency,
              source: p.source,
              metadata: { orderId: p.order_id, paymentId: p.id },
            },
            p.outbound_key,
            deadline,
          )
          .then((result) => chargeOutcome(result, earlierAttempt)),
      recorded: (p) => recordedOutcome(p.status, p.provider_transaction_id, p.failure_code),
      settle: (id, outcome, leaseToken) => this.settlement.settlePayment(id, outcome, leaseToken),
    };
  }

  /**
   * Phase 1, in the claim's transaction: the order locked (FOR UPDATE, the first lock after the key),
   * checked, and the payment inserted pending with its outbound key. A stored refusal (404, 409)
   * is returned; a temporary one (another payment in progress) is thrown, so the key is released.
   */
  private async createPendingPayment(
    clientId: string,
    orderId: string,
    source: string,
    keyId: string,
  ): Promise<{ row: PaymentRow } | { refusal: ProblemException }> {
    const [order] = isUUID(orderId)
      ? await this.db.query<{ status: OrderStatus; total_minor: string; currency: string }>(
          `SELECT status, total_minor, currency FROM orders WHERE id = $1 AND client_id = $2 FOR UPDATE`,
          [orderId, clientId],
        )
      : [];
    if (!order) return { refusal: orderNotFound(orderId) };
    if (order.status !== 'created') return { refusal: orderNotPayable(orderId, order.status) };
    if (Number(order.total_minor) === 0) return { refusal: nothingToPay(orderId) };
    // The partial unique index decides, under the order's lock: a payment already active (pending, or succeeded
    // on an order that somehow is still 'created') makes the insert do nothing, and is then named in the 409.
    const [payment] = await this.db.query<PaymentRow>(
      `INSERT INTO payments (id, client_id, order_id, idempotency_key_id, amount_minor, currency, source, outbound_key)
       SELECT g.id, $1, $2, $3, $4, $5, $6, $7 || g.id FROM (SELECT gen_random_uuid() AS id) g
       ON CONFLICT (order_id) WHERE status IN ('pending', 'succeeded') DO NOTHING
       RETURNING ${PAYMENT_COLUMNS}`,
      [clientId, orderId, keyId, order.total_minor, order.currency, source, outboundKeyOf('payment', '')],
    );
    if (payment) return { row: payment };
    const [active] = await this.db.query<{ id: string }>(
      `SELECT id FROM payments WHERE order_id = $1 AND status IN ('pending', 'succeeded')`,
      [orderId],
    );
    throw paymentInProgress(active?.id ?? 'unknown');
  }

  async listOrderPayments(clientId: string, orderId: string): Promise<PaymentView[]> {
    if (!isUUID(orderId)) throw orderNotFound(orderId);
    const rows = await this.db.query<PaymentRow & { order_exists: boolean }>(
      `SELECT ${prefixed('p', PAYMENT_COLUMNS)}, true AS order_exists FROM orders o LEFT JOIN payments p ON p.order_id = o.id
        WHERE o.id = $1 AND o.client_id = $2 ORDER BY p.created_at, p.id`,
      [orderId, clientId],
    );
    if (rows.length === 0) throw orderNotFound(orderId);
    return rows.filter((r) => r.id !== null).map(toPaymentView);
  }

  async findPayment(clientId: string, id: string): Promise<PaymentView> {
    const [row] = isUUID(id)
      ? await this.db.query<PaymentRow>(`SELECT ${PAYMENT_COLUMNS} FROM payments WHERE id = $1 AND client_id = $2`, [id, clientId])
      : [];
    if (!row) throw paymentNotFound(id);
    return toPaymentView(row);
  }
}
