import { Injectable } from '@nestjs/common';
import { isUUID } from 'class-validator';
import { ProblemException, problemType } from '../common/problem.js';
import { AtomicPhases, Database, type KeyScope, type LeasedKey, problemResponse, type StoredResponse } from '#idempotency';
import { orderNotFound } from '../orders/orders.service.js';
import type { OrderStatus } from '../orders/order-status.js';
import { PspClient, PspUnreachableError } from '../psp-client/psp-client.js';
import type { PaymentView } from './dto/payment.view.js';
import { nothingToPay, orderNotPayable, paymentInProgress, paymentNotFound, paymentPending, providerUnavailable } from './payment-problems.js';
import { outboundKeyOf, PAYMENT_COLUMNS, PAYMENT_CREATED, type PaymentRow, prefixed, toPaymentView } from './payment-records.js';
import { PaymentReconciler } from './payment-reconciler.js';
import { type ProviderOutcome, PaymentSettlement } from './payment-settlement.js';
import { ProviderAttempts } from './provider-attempts.js';
import { chargeOutcome, foundChargeOutcome, recordedOutcome } from './provider-outcomes.js';

/** What an idempotent payment endpoint answers: a stored response, sent as it is. */
export interface KeyAnswer {
  response: StoredResponse;
  replayed: boolean;
}

/** Phase 1's result: a stored business answer, or the pending payment to charge. */
type Phase1 = { answer: KeyAnswer } | { key: LeasedKey; paymentId: string; resumed: boolean };

/**
 * POST /orders/:id/payments as atomic phases (docs/contract.md#payments-and-refunds): the charge cannot join our
 * transaction, and a timeout does not say whether the card was charged — so an unknown outcome
 * is never final: the payment stays pending, and the same key (or the reconciler) asks again
 * with the same outbound key, which the provider dedupes.
 */
@Injectable()
export class PaymentsService {
  constructor(
    private readonly db: Database,
    private readonly phases: AtomicPhases,
    private readonly psp: PspClient,
    private readonly settlement: PaymentSettlement,
    private readonly reconciler: PaymentReconciler,
    private readonly attempts: ProviderAttempts,
  ) {}

  async payOrder(scope: KeyScope, orderId: string, source: string): Promise<KeyAnswer> {
    let phase1: Phase1;
    try {
      phase1 = await this.startPayment(scope, orderId, source);
    } catch (err) {
      // Another key's payment of this order is pending. If its request is gone (lease run out), settle it first, then try once more.
      const stale = err instanceof ProblemException && err.problem.type === problemType('payment-in-progress') && typeof err.problem.paymentId === 'string';
      if (!stale || !(await this.reconciler.reconcileStalePayment(err.problem.paymentId as string))) throw err;
      phase1 = await this.startPayment(scope, orderId, source);
    }
    if ('answer' in phase1) return phase1.answer;
    return { response: await this.chargeAndSettle(phase1.key, phase1.paymentId, phase1.resumed), replayed: false };
  }

  /** Phase 1: the key acquired and, for a new key, the pending payment written, in one transaction. */
  private startPayment(scope: KeyScope, orderId: string, source: string): Promise<Phase1> {
    return this.db.transaction(async (): Promise<Phase1> => {
      const acquired = await this.phases.acquire(scope);
      if (acquired.kind === 'completed') return { answer: { response: acquired.response, replayed: true } };
      if (acquired.kind === 'resumed') return { key: acquired.key, paymentId: await this.resumePayment(acquired.key.id), resumed: true };
      // Before anything is written: with the provider known to be down, fail now and leave the key free.
      const breaker = this.psp.chargeBreakerOpen();
      if (breaker.open) throw providerUnavailable(breaker.retryAfterSeconds);
      const created = await this.createPendingPayment(scope.clientId, orderId, source, acquired.key.id);
      if ('refusal' in created) {
        const response = problemResponse(created.refusal);
        await this.phases.complete(acquired.key.id, response);
        return { answer: { response, replayed: false } };
      }
      this.phases.setRecoveryPoint(acquired.key, PAYMENT_CREATED);
      return { key: acquired.key, paymentId: created.payment.id, resumed: false };
    });
  }

  /**
   * Phase 1, in the claim's transaction: the order locked (FOR UPDATE, the first lock after the key),
   * checked, and the payment inserted pending with its outbound key. A stored refusal (404, 409)
   * is returned; a temporary one (another payment in progress) is thrown, so the key is released.
   */
  private async createPendingPayment(clientId: string, orderId: string, source: string, keyId: string): Promise<{ payment: PaymentRow } | { refusal: ProblemException }> {
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
    if (payment) {
      // This holder calls the provider only before its lease ends: the bound every later decision waits out.
      this.attempts.firstAttempt('payments', payment.id, keyId);
      return { payment };
    }
    const [active] = await this.db.query<{ id: string }>(`SELECT id FROM payments WHERE order_id = $1 AND status IN ('pending', 'succeeded')`, [orderId]);
    throw paymentInProgress(active?.id ?? 'unknown');
  }

  /**
   * Phases 2 and 3. A resumed key first asks the provider what became of the payment (a lookup is
   * cheap and never delayed); only if it has no charge is the charge sent again, under the same
   * outbound key — which the provider dedupes with an earlier attempt that lands late. Past the re-send window
   * (ProviderAttempts.mayResend) it sends nothing and decides by lookups, as the reconciler does. An unknown
   * outcome releases the lease and answers 503: NOT stored.
   */
  async chargeAndSettle(key: LeasedKey, paymentId: string, resumed: boolean): Promise<StoredResponse> {
    const [payment] = await this.db.query<PaymentRow>(`SELECT ${PAYMENT_COLUMNS} FROM payments WHERE id = $1`, [paymentId]);
    if (resumed && payment.status === 'pending' && !this.attempts.mayResend(payment.created_at)) {
      // Nothing more is sent for this payment (ProviderAttempts.mayResend): lookups decide, as the reconciler's do.
      const decided = await this.reconciler.decide(key);
      if (decided) return decided.response;
      throw paymentPending(payment.id);
    }
    let outcome: ProviderOutcome | undefined;
    if (resumed) {
      outcome = await this.psp.findChargesByPayment(payment.id, { amountMinor: Number(payment.amount_minor), currency: payment.currency }).then(foundChargeOutcome, (err: unknown) => {
        if (err instanceof PspUnreachableError) return undefined;
        throw err;
      });
    }
    if (!outcome && payment.status === 'pending' && (!resumed || (await this.attempts.resending('payments', payment.id, key)))) {
      const result = await this.psp.createCharge(
        { amountMinor: Number(payment.amount_minor), currency: payment.currency, source: payment.source, metadata: { orderId: payment.order_id, paymentId: payment.id } },
        payment.outbound_key,
        key.deadline,
      );
      outcome = chargeOutcome(result);
    }
    if (!outcome && payment.status === 'pending') {
      await this.attempts.gaveUp(payment.id, key);
      throw paymentPending(payment.id);
    }
    // A payment settled meanwhile (a webhook) is answered from its row by the settlement.
    const settled = await this.settlement.settlePayment(payment.id, outcome ?? recordedOutcome(payment.status, payment.provider_transaction_id, payment.failure_code), key.leaseToken);
    if (settled.kind === 'lost') throw paymentPending(payment.id);
    return settled.response;
  }

  /** The payment of a key being resumed. */
  private async resumePayment(keyId: string): Promise<string> {
    const paymentId = await this.attempts.ofKey('payments', keyId);
    // Only a key at PAYMENT_CREATED is ever committed unfinished, and its payment was inserted with it.
    if (!paymentId) throw new Error(`payment key ${keyId} is unfinished but has no payment`);
    return paymentId;
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
    const [row] = isUUID(id) ? await this.db.query<PaymentRow>(`SELECT ${PAYMENT_COLUMNS} FROM payments WHERE id = $1 AND client_id = $2`, [id, clientId]) : [];
    if (!row) throw paymentNotFound(id);
    return toPaymentView(row);
  }
}

