import { Injectable, Logger } from '@nestjs/common';
import { AtomicPhases, Database, type StoredResponse } from '@idempotent-orders/idempotency';
import { retryOnceOnDeadlock } from '#service-kit';
import { OrdersService } from '../orders/orders.service.js';
import { type FoundBy, LateChargeRefunder } from './late-charge-refunder.js';
import { PaymentMetrics } from './payment-metrics.js';
import {
  PAYMENT_COLUMNS,
  paymentAnswer,
  type PaymentRow,
  prefixed,
  REFUND_COLUMNS,
  refundAnswer,
  type RefundRow,
} from './payment-records.js';
import { ProviderAttempts } from './provider-attempts.js';

/** The failure code of a payment or refund we failed without the provider's word: the sweep keeps asking about those. */
export const NEVER_REACHED_CODE = 'provider_unreachable';

/** What applyLateRefund did: applied it, found it applied already, or could not (our reservations leave no room). */
export type LateRefundResult = 'applied' | 'already-applied' | 'no-room';

/** What the provider said about a charge or a refund (or, for provider_unreachable, that it never saw one). */
export type ProviderOutcome =
  { status: 'succeeded'; providerId: string } | { status: 'failed'; failureCode: string; providerId?: string | null };

export type Settled =
  /** The key's answer: the one this settler stored, or the one whoever settled first stored. `changed`: this settler settled it. */
  | { kind: 'answered'; response: StoredResponse; changed: boolean; lateRefundId?: string }
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
  private readonly logger = new Logger('PaymentSettlement');

  constructor(
    private readonly db: Database,
    private readonly phases: AtomicPhases,
    private readonly orders: OrdersService,
    private readonly lateCharges: LateChargeRefunder,
    private readonly metrics: PaymentMetrics,
    private readonly attempts: ProviderAttempts,
  ) {}

  /**
   * `leaseToken`: the settler holds the key's lease (request, retry, reconciler) and writes only while it still does.
   * A confirmed charge for a payment already failed (or settled with another charge) is refunded once this commits.
   */
  async settlePayment(paymentId: string, outcome: ProviderOutcome, leaseToken?: string): Promise<Settled> {
    const settled = await retryOnceOnDeadlock(() =>
      this.db.transaction(() => this.applyPaymentOutcome(paymentId, outcome, leaseToken, 'settler')),
    );
    if (settled.kind === 'answered' && settled.lateRefundId) this.lateCharges.refundInBackground(settled.lateRefundId);
    return settled;
  }

  settleRefund(refundId: string, outcome: ProviderOutcome, leaseToken?: string): Promise<Settled> {
    return retryOnceOnDeadlock(() => this.db.transaction(() => this.applyRefundOutcome(refundId, outcome, leaseToken, 'settler')));
  }

  /**
   * settlePayment's work, for a caller that already holds a transaction it writes more into (the
   * webhook consumer records the event in it). Such a caller retries a deadlock itself: a failed
   * statement aborts its whole transaction. A holder whose lease was taken over settles nothing on a decision of
   * its own, but a provider's confirmation (an outcome with the provider's id) is a fact, whoever holds the key:
   * it is applied as a webhook's would be, never dropped.
   */
  async applyPaymentOutcome(
    paymentId: string,
    outcome: ProviderOutcome,
    leaseToken: string | undefined,
    foundBy: FoundBy,
  ): Promise<Settled> {
    const [payment] = await this.db.query<PaymentRow>(`SELECT ${PAYMENT_COLUMNS} FROM payments WHERE id = $1`, [paymentId]);
    if (!payment) throw new Error(`payment ${paymentId} vanished while being settled`);
    const lock = await this.lockKey(payment.idempotency_key_id, leaseToken, outcome);
    if (lock.kind !== 'locked') return lock.kind === 'lost' ? lock : { kind: 'answered', response: lock.response, changed: false };
    const key = lock.key;
    // The next lock in the lock order, before the UPDATE locks the payment.
    await this.db.query(`SELECT 1 FROM orders WHERE id = $1 FOR UPDATE`, [payment.order_id]);
    const [settled] = await this.db.query<PaymentRow>(
      `UPDATE payments
          SET status = $2, provider_transaction_id = coalesce($3, provider_transaction_id), failure_code = $4, updated_at = now()
        WHERE id = $1 AND status = 'pending'
       RETURNING ${PAYMENT_COLUMNS}`,
      [paymentId, outcome.status, outcome.providerId ?? null, outcome.status === 'failed' ? outcome.failureCode : null],
    );
    if (settled?.status === 'succeeded') await this.orders.transitionOrder(settled.client_id, settled.order_id, 'paid');
    if (settled?.failure_code === NEVER_REACHED_CODE) await this.attempts.failedUnreached('payments', settled.id);
    const current = settled ?? (await this.db.query<PaymentRow>(`SELECT ${PAYMENT_COLUMNS} FROM payments WHERE id = $1`, [paymentId]))[0];
    // The provider confirms a charge, but the payment was settled otherwise first (failed as never reached, or paid
    // with another charge): that money is not ours to keep, and dropping the confirmation would keep it.
    const lateRefundId =
      !settled && outcome.status === 'succeeded' && isLateCharge(current, outcome.providerId)
        ? await this.recordLateCharge(current, outcome.providerId, foundBy)
        : undefined;
    const answered = await this.answer(key, payment.idempotency_key_id, paymentAnswer(current), settled !== undefined);
    return answered.kind === 'answered' && lateRefundId ? { ...answered, lateRefundId } : answered;
  }

  /**
   * In the caller's transaction: the refund of a charge that landed on `payment` after it was settled without it.
   * The sweep stops asking about the payment in the same commit.
   */
  async recordLateCharge(
    payment: Pick<PaymentRow, 'id' | 'amount_minor'>,
    chargeId: string,
    foundBy: FoundBy,
  ): Promise<string | undefined> {
    await this.attempts.found(payment.id);
    return this.lateCharges.requestRefund(payment.id, chargeId, Number(payment.amount_minor), foundBy);
  }

  /** settleRefund's work inside the caller's transaction (see applyPaymentOutcome). */
  async applyRefundOutcome(refundId: string, outcome: ProviderOutcome, leaseToken: string | undefined, foundBy: FoundBy): Promise<Settled> {
    const [refund] = await this.db.query<RefundRow & { order_id: string }>(
      `SELECT ${prefixed('r', REFUND_COLUMNS)}, p.order_id FROM refunds r JOIN payments p ON p.id = r.payment_id WHERE r.id = $1`,
      [refundId],
    );
    if (!refund) throw new Error(`refund ${refundId} vanished while being settled`);
    const lock = await this.lockKey(refund.idempotency_key_id, leaseToken, outcome);
    if (lock.kind !== 'locked') return lock.kind === 'lost' ? lock : { kind: 'answered', response: lock.response, changed: false };
    const key = lock.key;
    // Order, then payment: the lock order.
    await this.db.query(`SELECT 1 FROM orders WHERE id = $1 FOR UPDATE`, [refund.order_id]);
    const [payment] = await this.db.query<PaymentRow>(`SELECT ${PAYMENT_COLUMNS} FROM payments WHERE id = $1 FOR UPDATE`, [
      refund.payment_id,
    ]);
    const [settled] = await this.db.query<RefundRow>(
      `UPDATE refunds
          SET status = $2, provider_refund_id = coalesce($3, provider_refund_id), failure_code = $4, updated_at = now()
        WHERE id = $1 AND status = 'pending'
       RETURNING ${REFUND_COLUMNS}`,
      [refundId, outcome.status, outcome.providerId ?? null, outcome.status === 'failed' ? outcome.failureCode : null],
    );
    if (settled?.status === 'failed') {
      // Only the transaction that failed the refund gives its reservation back: exactly once.
      await this.db.query(`UPDATE payments SET refunded_minor = refunded_minor - $2, updated_at = now() WHERE id = $1`, [
        payment.id,
        settled.amount_minor,
      ]);
    }
    if (settled?.status === 'succeeded') await this.refundedInFull(payment);
    if (settled?.failure_code === NEVER_REACHED_CODE) await this.attempts.failedUnreached('refunds', settled.id);
    const current = settled ?? (await this.db.query<RefundRow>(`SELECT ${REFUND_COLUMNS} FROM refunds WHERE id = $1`, [refundId]))[0];
    // The provider confirms a refund we had already failed (never reached): the money went back, so the books must say so.
    if (!settled && outcome.status === 'succeeded' && current.status === 'failed')
      await this.applyLateRefund(current.id, outcome.providerId, foundBy);
    if (!settled && outcome.status === 'succeeded') this.alertIfSecondRefund(current, outcome.providerId, foundBy);
    return this.answer(key, refund.idempotency_key_id, refundAnswer(current), settled !== undefined);
  }

  /**
   * A second provider refund for one refund of ours already succeeded (as a second charge is for a payment): the
   * customer got the money twice, which only a person can take back. Said loudly and counted, never dropped. True when it was one.
   */
  alertIfSecondRefund(
    refund: Pick<RefundRow, 'id' | 'payment_id' | 'status' | 'provider_refund_id'>,
    providerRefundId: string,
    foundBy: FoundBy,
  ): boolean {
    if (refund.status !== 'succeeded' || refund.provider_refund_id === providerRefundId) return false;
    this.metrics.lateLandings.inc({ kind: 'second_refund', found_by: foundBy });
    this.logger.error(
      { refundId: refund.id, paymentId: refund.payment_id, providerRefundId, settledWith: refund.provider_refund_id, foundBy, alert: true },
      'the provider confirms a second refund for a refund already settled: money returned twice, reconcile by hand',
    );
    return true;
  }

  /**
   * In the caller's transaction: a refund we failed that the provider made after all. It becomes succeeded, its
   * amount counts in the payment's `refunded_minor` again (failing it gave the reservation back), and the order
   * becomes refunded when that completes the amount. The refund's key keeps the 402 it answered: a completed key
   * never changes; GET /refunds/:id tells the truth.
   */
  async applyLateRefund(refundId: string, providerRefundId: string, foundBy: FoundBy): Promise<LateRefundResult> {
    const [facts] = await this.db.query<{ order_id: string; payment_id: string }>(
      `SELECT p.order_id, r.payment_id FROM refunds r JOIN payments p ON p.id = r.payment_id WHERE r.id = $1`,
      [refundId],
    );
    if (!facts) throw new Error(`refund ${refundId} vanished while a late refund was applied to it`);
    await this.db.query(`SELECT 1 FROM orders WHERE id = $1 FOR UPDATE`, [facts.order_id]);
    const [payment] = await this.db.query<PaymentRow>(`SELECT ${PAYMENT_COLUMNS} FROM payments WHERE id = $1 FOR UPDATE`, [
      facts.payment_id,
    ]);
    const [refund] = await this.db.query<RefundRow>(`SELECT ${REFUND_COLUMNS} FROM refunds WHERE id = $1 FOR UPDATE`, [refundId]);
    if (refund.status !== 'failed') return 'already-applied';
    const amount = Number(refund.amount_minor);
    if (Number(payment.refunded_minor) + amount > Number(payment.amount_minor)) {
      // Our books already hold more than the payment for refunds (another one pending): the provider will refuse that
      // one, but this cannot be squared automatically without guessing. Say so loudly; the sweep asks again later.
      this.logger.error(
        { refundId, paymentId: payment.id, providerRefundId, alert: true },
        'a refund landed late but our reservations leave no room for it: reconcile by hand',
      );
      return 'no-room';
    }
    await this.db.query(
      `UPDATE refunds SET status = 'succeeded', provider_refund_id = $2, failure_code = NULL, updated_at = now() WHERE id = $1`,
      [refundId, providerRefundId],
    );
    await this.attempts.found(refundId);
    await this.db.query(`UPDATE payments SET refunded_minor = refunded_minor + $2, updated_at = now() WHERE id = $1`, [payment.id, amount]);
    await this.refundedInFull(payment);
    this.metrics.lateLandings.inc({ kind: 'refund', found_by: foundBy });
    this.logger.warn(
      { refundId, paymentId: payment.id, providerRefundId, amountMinor: amount, foundBy },
      'a refund we had failed landed at the provider: applied to the books',
    );
    return 'applied';
  }

  /**
   * The key row locked for settling (the first lock of the lock order). A holder that no longer owns it goes on
   * only with a provider's confirmation, as a webhook would ('lost' otherwise); no key (a row without one): undefined.
   */
  private async lockKey(
    keyId: string | null,
    leaseToken: string | undefined,
    outcome: ProviderOutcome,
  ): Promise<{ kind: 'lost' } | { kind: 'replay'; response: StoredResponse } | { kind: 'locked'; key: KeyLock | undefined }> {
    if (!keyId) return { kind: 'locked', key: undefined };
    const key = await this.phases.lockForSettling(keyId, leaseToken);
    if (leaseToken === undefined || key.owned) return { kind: 'locked', key };
    // A decision of this holder's own (never reached) counts only under its lease: whoever completed the key answers.
    if (!outcome.providerId) return key.response ? { kind: 'replay', response: key.response } : { kind: 'lost' };
    return { kind: 'locked', key: await this.phases.lockForSettling(keyId) };
  }

  /** Under the payment's row lock, so two refunds settling at once cannot both miss the total. */
  private async refundedInFull(payment: PaymentRow): Promise<void> {
    const [{ refunded }] = await this.db.query<{ refunded: string }>(
      `SELECT coalesce(sum(amount_minor), 0) AS refunded FROM refunds WHERE payment_id = $1 AND status = 'succeeded'`,
      [payment.id],
    );
    if (Number(refunded) === Number(payment.amount_minor))
      await this.orders.transitionOrder(payment.client_id, payment.order_id, 'refunded');
  }

  /** Completes the key with `answer` when it is still open; when someone completed it first, their stored answer wins. */
  private async answer(key: KeyLock | undefined, keyId: string | null, answer: StoredResponse, changed: boolean): Promise<Settled> {
    if (key?.owned && keyId) {
      await this.phases.complete(keyId, answer);
      return { kind: 'answered', response: answer, changed };
    }
    return { kind: 'answered', response: key && !key.owned && key.response ? key.response : answer, changed };
  }
}

type KeyLock = Awaited<ReturnType<AtomicPhases['lockForSettling']>>;

/** A confirmed charge that is not the one the payment is settled with. */
function isLateCharge(payment: PaymentRow, chargeId: string): boolean {
  return payment.status === 'failed' || (payment.status === 'succeeded' && payment.provider_transaction_id !== chargeId);
}
