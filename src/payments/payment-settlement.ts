import { Injectable } from '@nestjs/common';
import { Database } from '../database/database.service.js';
import { retryOnceOnDeadlock } from '../database/pg-errors.js';
import { AtomicPhases } from '../idempotency/atomic-phases.js';
import type { StoredResponse } from '../idempotency/idempotency-keys.service.js';
import { OrdersService } from '../orders/orders.service.js';
import { PAYMENT_COLUMNS, paymentAnswer, type PaymentRow, REFUND_COLUMNS, refundAnswer, refundColumnsOf, type RefundRow } from './payment-records.js';

/** What the provider said about a charge or a refund (or, for provider_unreachable, that it never saw one). */
export type ProviderOutcome =
  | { status: 'succeeded'; providerId: string }
  | { status: 'failed'; failureCode: string; providerId?: string | null };

export type Settled =
  /** The key's answer: the one this settler stored, or the one whoever settled first stored. `changed`: this settler settled it. */
  | { kind: 'answered'; response: StoredResponse; changed: boolean }
  /** This holder's lease was taken over: the new holder settles and answers. */
  | { kind: 'lost' };

/**
 * Phase 3 of a payment or refund, for every settler: the request, a retry that resumed it, the
 * reconciler and (later) a webhook. One transaction takes its row locks in one order — key,
 * order, payment, refund — so settlers never deadlock one another; the conditional UPDATE
 * (`WHERE status = 'pending'`) lets exactly one of them settle; the key is completed with the
 * answer in that same transaction, so a retry replays it without asking the provider again.
 */
@Injectable()
export class PaymentSettlement {
  constructor(
    private readonly db: Database,
    private readonly phases: AtomicPhases,
    private readonly orders: OrdersService,
  ) {}

  /** `leaseToken`: the settler holds the key's lease (request, retry, reconciler) and writes only while it still does. */
  settlePayment(paymentId: string, outcome: ProviderOutcome, leaseToken?: string): Promise<Settled> {
    return retryOnceOnDeadlock(() => this.db.transaction(() => this.applyPaymentOutcome(paymentId, outcome, leaseToken)));
  }

  settleRefund(refundId: string, outcome: ProviderOutcome, leaseToken?: string): Promise<Settled> {
    return retryOnceOnDeadlock(() => this.db.transaction(() => this.applyRefundOutcome(refundId, outcome, leaseToken)));
  }

  /**
   * settlePayment's work, for a caller that already holds a transaction it writes more into (the
   * webhook consumer records the event in it). Such a caller retries a deadlock itself: a failed
   * statement aborts its whole transaction.
   */
  async applyPaymentOutcome(paymentId: string, outcome: ProviderOutcome, leaseToken?: string): Promise<Settled> {
    const [payment] = await this.db.query<PaymentRow>(`SELECT ${PAYMENT_COLUMNS} FROM payments WHERE id = $1`, [paymentId]);
    if (!payment) throw new Error(`payment ${paymentId} vanished while being settled`);
    const key = payment.idempotency_key_id ? await this.phases.lockForSettling(payment.idempotency_key_id, leaseToken) : undefined;
    if (leaseToken !== undefined && !key?.owned) return key?.response ? { kind: 'answered', response: key.response, changed: false } : { kind: 'lost' };
    await this.db.query(`SELECT 1 FROM orders WHERE id = $1 FOR UPDATE`, [payment.order_id]);
    const [settled] = await this.db.query<PaymentRow>(
      `UPDATE payments
          SET status = $2, provider_transaction_id = coalesce($3, provider_transaction_id), failure_code = $4, updated_at = now()
        WHERE id = $1 AND status = 'pending'
       RETURNING ${PAYMENT_COLUMNS}`,
      [paymentId, outcome.status, outcome.providerId ?? null, outcome.status === 'failed' ? outcome.failureCode : null],
    );
    if (settled?.status === 'succeeded') await this.orders.transitionOrder(settled.client_id, settled.order_id, 'paid');
    const current = settled ?? (await this.db.query<PaymentRow>(`SELECT ${PAYMENT_COLUMNS} FROM payments WHERE id = $1`, [paymentId]))[0];
    return this.answer(key, payment.idempotency_key_id, paymentAnswer(current), settled !== undefined);
  }

  /** settleRefund's work inside the caller's transaction (see applyPaymentOutcome). */
  async applyRefundOutcome(refundId: string, outcome: ProviderOutcome, leaseToken?: string): Promise<Settled> {
    const [refund] = await this.db.query<RefundRow & { order_id: string }>(
      `SELECT ${refundColumnsOf('r')}, p.order_id FROM refunds r JOIN payments p ON p.id = r.payment_id WHERE r.id = $1`,
      [refundId],
    );
    if (!refund) throw new Error(`refund ${refundId} vanished while being settled`);
    const key = refund.idempotency_key_id ? await this.phases.lockForSettling(refund.idempotency_key_id, leaseToken) : undefined;
    if (leaseToken !== undefined && !key?.owned) return key?.response ? { kind: 'answered', response: key.response, changed: false } : { kind: 'lost' };
    await this.db.query(`SELECT 1 FROM orders WHERE id = $1 FOR UPDATE`, [refund.order_id]);
    const [payment] = await this.db.query<PaymentRow>(`SELECT ${PAYMENT_COLUMNS} FROM payments WHERE id = $1 FOR UPDATE`, [refund.payment_id]);
    const [settled] = await this.db.query<RefundRow>(
      `UPDATE refunds
          SET status = $2, provider_refund_id = coalesce($3, provider_refund_id), failure_code = $4, updated_at = now()
        WHERE id = $1 AND status = 'pending'
       RETURNING ${REFUND_COLUMNS}`,
      [refundId, outcome.status, outcome.providerId ?? null, outcome.status === 'failed' ? outcome.failureCode : null],
    );
    if (settled?.status === 'failed') {
      // Only the transaction that failed the refund gives its reservation back: exactly once.
      await this.db.query(`UPDATE payments SET refunded_minor = refunded_minor - $2, updated_at = now() WHERE id = $1`, [payment.id, settled.amount_minor]);
    }
    if (settled?.status === 'succeeded') {
      // Under the payment's row lock, so two refunds settling at once cannot both miss the total.
      const [{ refunded }] = await this.db.query<{ refunded: string }>(
        `SELECT coalesce(sum(amount_minor), 0) AS refunded FROM refunds WHERE payment_id = $1 AND status = 'succeeded'`,
        [payment.id],
      );
      if (Number(refunded) === Number(payment.amount_minor)) await this.orders.transitionOrder(payment.client_id, payment.order_id, 'refunded');
    }
    const current = settled ?? (await this.db.query<RefundRow>(`SELECT ${REFUND_COLUMNS} FROM refunds WHERE id = $1`, [refundId]))[0];
    return this.answer(key, refund.idempotency_key_id, refundAnswer(current), settled !== undefined);
  }

  /** Completes the key with `answer` when it is still open; when someone completed it first, their stored answer wins. */
  private async answer(key: Awaited<ReturnType<AtomicPhases['lockForSettling']>> | undefined, keyId: string | null, answer: StoredResponse, changed: boolean): Promise<Settled> {
    if (key?.owned && keyId) {
      await this.phases.complete(keyId, answer);
      return { kind: 'answered', response: answer, changed };
    }
    return { kind: 'answered', response: key && !key.owned && key.response ? key.response : answer, changed };
  }
}

