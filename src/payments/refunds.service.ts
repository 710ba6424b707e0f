import { Injectable } from '@nestjs/common';
import { isUUID } from 'class-validator';
import type { ProblemException } from '../common/problem.js';
import { AtomicPhases, Database, type KeyScope, type LeasedKey, problemResponse, type StoredResponse } from '#idempotency';
import type { OrderStatus } from '../orders/order-status.js';
import { PspClient, PspUnreachableError } from '../psp-client/psp-client.js';
import type { RefundView } from './dto/refund.view.js';
import { paymentNotFound, paymentPending, providerUnavailable, refundExceedsPayment, refundNotAllowed, refundNotFound } from './payment-problems.js';
import { outboundKeyOf, PAYMENT_COLUMNS, type PaymentRow, prefixed, REFUND_COLUMNS, REFUND_CREATED, type RefundRow, toRefundView } from './payment-records.js';
import { PaymentReconciler } from './payment-reconciler.js';
import { ProviderAttempts } from './provider-attempts.js';
import { type ProviderOutcome, PaymentSettlement } from './payment-settlement.js';
import { foundRefundOutcome, recordedOutcome, refundOutcome } from './provider-outcomes.js';
import type { KeyAnswer } from './payments.service.js';

type Phase1 = { answer: KeyAnswer } | { key: LeasedKey; refundId: string; resumed: boolean };

/**
 * Reserves $2 of payment $1's refundable amount: one conditional UPDATE, so refunds racing on one payment
 * can never reserve more than it holds (ck_payments_refunded_minor backs it). No row back: it would exceed.
 */
export const RESERVE_REFUND = `UPDATE payments SET refunded_minor = refunded_minor + $2, updated_at = now() WHERE id = $1 AND refunded_minor + $2 <= amount_minor RETURNING id`;

/**
 * POST /payments/:id/refunds, in the same atomic phases as a payment. The amount is reserved in
 * phase 1 by one conditional UPDATE (`refunded_minor + amount <= amount_minor`), so refunds racing
 * in parallel can never add up to more than was paid; a failed refund gives its reservation back.
 */
@Injectable()
export class RefundsService {
  constructor(
    private readonly db: Database,
    private readonly phases: AtomicPhases,
    private readonly psp: PspClient,
    private readonly settlement: PaymentSettlement,
    private readonly attempts: ProviderAttempts,
    private readonly reconciler: PaymentReconciler,
  ) {}

  async refundPayment(scope: KeyScope, paymentId: string, amountMinor: number | undefined): Promise<KeyAnswer> {
    const phase1 = await this.db.transaction(async (): Promise<Phase1> => {
      const acquired = await this.phases.acquire(scope);
      if (acquired.kind === 'completed') return { answer: { response: acquired.response, replayed: true } };
      if (acquired.kind === 'resumed') return { key: acquired.key, refundId: await this.resumeRefund(acquired.key.id), resumed: true };
      const breaker = this.psp.chargeBreakerOpen();
      if (breaker.open) throw providerUnavailable(breaker.retryAfterSeconds);
      const created = await this.createPendingRefund(scope.clientId, paymentId, amountMinor, acquired.key.id);
      if ('refusal' in created) {
        const response = problemResponse(created.refusal);
        await this.phases.complete(acquired.key.id, response);
        return { answer: { response, replayed: false } };
      }
      this.phases.setRecoveryPoint(acquired.key, REFUND_CREATED);
      return { key: acquired.key, refundId: created.refund.id, resumed: false };
    });
    if ('answer' in phase1) return phase1.answer;
    return { response: await this.refundAndSettle(phase1.key, phase1.refundId, phase1.resumed), replayed: false };
  }

  /** Phase 1: order then payment locked (the one lock order), checked, the amount reserved, the refund inserted pending. */
  private async createPendingRefund(clientId: string, paymentId: string, amountMinor: number | undefined, keyId: string): Promise<{ refund: RefundRow } | { refusal: ProblemException }> {
    const [found] = isUUID(paymentId) ? await this.db.query<{ order_id: string }>(`SELECT order_id FROM payments WHERE id = $1 AND client_id = $2`, [paymentId, clientId]) : [];
    if (!found) return { refusal: paymentNotFound(paymentId) };
    const [order] = await this.db.query<{ status: OrderStatus }>(`SELECT status FROM orders WHERE id = $1 FOR UPDATE`, [found.order_id]);
    const [payment] = await this.db.query<PaymentRow>(`SELECT ${PAYMENT_COLUMNS} FROM payments WHERE id = $1 FOR UPDATE`, [paymentId]);
    if (payment.status !== 'succeeded' || order.status !== 'cancelled') return { refusal: refundNotAllowed(paymentId, payment.status, order.status) };
    const refundable = Number(payment.amount_minor) - Number(payment.refunded_minor);
    const amount = amountMinor ?? refundable;
    const [reserved] =
      amount > 0
        ? await this.db.query(
            RESERVE_REFUND,
            [paymentId, amount],
          )
        : [];
    if (!reserved) return { refusal: refundExceedsPayment(paymentId, amount, refundable) };
    const [refund] = await this.db.query<RefundRow>(
      `INSERT INTO refunds (id, client_id, payment_id, idempotency_key_id, amount_minor, outbound_key)
       SELECT g.id, $1, $2, $3, $4, $5 || g.id FROM (SELECT gen_random_uuid() AS id) g
       RETURNING ${REFUND_COLUMNS}`,
      [clientId, paymentId, keyId, amount, outboundKeyOf('refund', '')],
    );
    this.attempts.firstAttempt('refunds', refund.id, keyId);
    return { refund };
  }

  /** Phases 2 and 3, as for a payment: look up first when resuming, the same outbound key on every call, 503 while unknown. */
  async refundAndSettle(key: LeasedKey, refundId: string, resumed: boolean): Promise<StoredResponse> {
    const [refund] = await this.db.query<RefundRow & { charge_id: string }>(
      `SELECT ${prefixed('r', REFUND_COLUMNS)}, p.provider_transaction_id AS charge_id FROM refunds r JOIN payments p ON p.id = r.payment_id WHERE r.id = $1`,
      [refundId],
    );
    if (resumed && refund.status === 'pending' && !this.attempts.mayResend(refund.created_at)) {
      // Nothing more is sent for this refund: lookups decide, as the reconciler's do.
      const decided = await this.reconciler.decide(key);
      if (decided) return decided.response;
      throw paymentPending(refund.id, 'refund');
    }
    let outcome: ProviderOutcome | undefined;
    if (resumed) {
      outcome = await this.psp.findRefundsByRefund(refund.id, { paymentId: refund.payment_id, amountMinor: Number(refund.amount_minor) }).then(foundRefundOutcome, (err: unknown) => {
        if (err instanceof PspUnreachableError) return undefined;
        throw err;
      });
    }
    if (!outcome && refund.status === 'pending' && (!resumed || (await this.attempts.resending('refunds', refund.id, key)))) {
      const result = await this.psp.createRefund(
        { chargeId: refund.charge_id, amountMinor: Number(refund.amount_minor), metadata: { refundId: refund.id, paymentId: refund.payment_id } },
        refund.outbound_key,
        key.deadline,
      );
      outcome = refundOutcome(result);
    }
    if (!outcome && refund.status === 'pending') {
      await this.attempts.gaveUp(refund.id, key);
      throw paymentPending(refund.id, 'refund');
    }
    // A refund settled meanwhile (a webhook) is answered from its row by the settlement.
    const settled = await this.settlement.settleRefund(refund.id, outcome ?? recordedOutcome(refund.status, refund.provider_refund_id, refund.failure_code), key.leaseToken);
    if (settled.kind === 'lost') throw paymentPending(refund.id, 'refund');
    return settled.response;
  }

  /** The refund of a key being resumed. */
  private async resumeRefund(keyId: string): Promise<string> {
    const refundId = await this.attempts.ofKey('refunds', keyId);
    if (!refundId) throw new Error(`refund key ${keyId} is unfinished but has no refund`);
    return refundId;
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
    const [row] = isUUID(id) ? await this.db.query<RefundRow>(`SELECT ${REFUND_COLUMNS} FROM refunds WHERE id = $1 AND client_id = $2`, [id, clientId]) : [];
    if (!row) throw refundNotFound(id);
    return toRefundView(row);
  }
}

