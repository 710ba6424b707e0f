import { Injectable } from '@nestjs/common';
import { isUUID } from 'class-validator';
import { AtomicPhases, Database, type KeyScope, type LeasedKey, problemResponse } from '@idempotent-orders/idempotency';
import type { KeyAnswer } from '../common/idempotent-endpoint.js';
import type { OrderStatus } from '../orders/order-status.js';
import { PspClient, PspUnreachableError } from '../psp-client/psp-client.js';
import type { RefundView } from './dto/refund.view.js';
import {
  paymentNotFound,
  paymentPending,
  providerUnavailable,
  refundExceedsPayment,
  refundNotAllowed,
  refundNotFound,
} from './payment-problems.js';
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
import { PaymentReconciler } from './payment-reconciler.js';
import { PaymentSettlement, type ProviderOutcome } from './payment-settlement.js';
import { ProviderAttempts } from './provider-attempts.js';
import { foundRefundOutcome, recordedOutcome, refundOutcome } from './provider-outcomes.js';
import { type ProblemException } from '#service-kit';

/**
 * Reserves $2 of payment $1's refundable amount: one conditional UPDATE, so refunds racing on one payment
 * can never reserve more than it holds (ck_payments_refunded_minor backs it). No row back: it would exceed.
 */
export const RESERVE_REFUND = `UPDATE payments SET refunded_minor = refunded_minor + $2, updated_at = now() WHERE id = $1 AND refunded_minor + $2 <= amount_minor RETURNING id`;

/**
 * A refund with the charge it refunds (a succeeded payment's charge never changes) and the source that charge was made
 * with: a refund inherits its test-token faults, so the source picks its breaker too.
 */
type RefundToSend = RefundRow & { charge_id: string; charge_source: string };

/** Where phase 1 leaves a request: answered already, or holding the key's lease with the refund to send. */
type AfterPhase1 = { answer: KeyAnswer } | { key: LeasedKey; refund: RefundToSend; resumed: boolean };

/**
 * POST /payments/:id/refunds, the same sequence as a payment (PaymentsService): `refundPayment` top to bottom.
 *
 *   ① claim the key, with a lease                   ┐ ONE transaction: all commit or none does
 *   ② reserve the amount, insert the pending refund ┘ → recovery point `refund_created`
 *   ③ call the provider                             no transaction open
 *   ④ settle the refund under the lease             ┐ ONE transaction (PaymentSettlement); a failed refund
 *   ⑤ complete the key with the answer              ┘ gives its reservation back → `finished`
 *
 * The reservation is one conditional UPDATE (`refunded_minor + amount <= amount_minor`), so refunds racing in
 * parallel can never add up to more than was paid.
 */
@Injectable()
export class RefundsService {
  constructor(
    private readonly db: Database,
    private readonly phases: AtomicPhases,
    private readonly psp: PspClient,
    private readonly attempts: ProviderAttempts,
    private readonly settlement: PaymentSettlement,
    private readonly reconciler: PaymentReconciler,
  ) {}

  async refundPayment(scope: KeyScope, paymentId: string, amountMinor: number | undefined): Promise<KeyAnswer> {
    // ① + ②, one transaction. Dies in it: all rolled back — no key, no reservation, no refund; a retry starts afresh.
    const phase1 = await this.db.transaction(async (): Promise<AfterPhase1> => {
      const acquired = await this.phases.acquire(scope); // ① 409 while another request holds the lease, 422 for another body
      switch (acquired.kind) {
        case 'completed': // finished earlier: its stored answer, byte for byte
          return { answer: { response: acquired.response, replayed: true } };
        case 'resumed': // an earlier holder's lease ran out: re-enter at its recovery point
          return { key: acquired.key, refund: await this.refundOfKey(acquired.key), resumed: true };
        case 'claimed': // new: ② in this same transaction
          return this.createPendingRefund(acquired.key, scope.clientId, paymentId, amountMinor);
      }
    });
    if ('answer' in phase1) return phase1.answer;
    const { key, refund, resumed } = phase1;

    // Where the request goes on is the recovery point its key is committed at. ① and ② commit together and ④+⑤ end at
    // `finished` (a completed key, answered above), so `refund_created` is the only point a key is ever left unfinished at:
    // a new key has just committed it, a resumed one re-enters at it. A new phase would be a new point and a new case.
    switch (key.recoveryPoint) {
      case REFUND_CREATED: {
        // ③ The provider call, outside any transaction. Dies here: the key stays `refund_created` (the amount still
        // reserved) under a lease that runs out; the retry (or the reconciler) re-enters here, asks the provider about
        // `refund_<id>` and re-sends under that same outbound key only if it has nothing: refunded at most once.
        let outcome: ProviderOutcome | undefined;
        if (!resumed) {
          outcome = await this.sendRefund(refund, key, false);
        } else if (refund.status === 'pending' && !this.attempts.mayResend(refund.created_at)) {
          // Past the re-send window nothing more is sent: decided by lookups, as the reconciler decides (④ and ⑤ included).
          const decided = await this.reconciler.decide(key);
          if (decided) return { response: decided.response, replayed: false };
          throw paymentPending(refund.id, 'refund');
        } else {
          outcome = await this.lookUpRefund(refund);
          // Nothing at the provider yet: send again, after raising the bound on our last attempt (false: lease lost).
          if (!outcome && refund.status === 'pending' && (await this.attempts.resending('refunds', refund.id, key)))
            outcome = await this.sendRefund(refund, key, true);
        }
        if (!outcome && refund.status === 'pending') {
          // Unknown: never final, the reservation stays. The bound comes down to now and the lease is given back, so
          // the retry this 503 asks for resumes at once. Dies before that: the lease runs out instead.
          await this.attempts.gaveUp(refund.id, key);
          throw paymentPending(refund.id, 'refund');
        }
        // ④ + ⑤, one transaction, fenced by this holder's lease token: the refund's conditional UPDATE (a failure gives
        // the reservation back, exactly once), the order to refunded when the amount is complete, the key completed.
        // Dies in it: rolled back; the next holder asks the provider again and settles the same way.
        const settled = await this.settlement.settleRefund(refund.id, outcome ?? this.recorded(refund), key.leaseToken);
        // Our lease ran out and another holder took the key over: it settles and answers.
        if (settled.kind === 'lost') throw paymentPending(refund.id, 'refund');
        return { response: settled.response, replayed: false };
      }
      default:
        throw new Error(`refund key ${key.id} is at recovery point ${key.recoveryPoint}, which this build does not know`);
    }
  }

  /**
   * ②, in ①'s transaction: order then payment locked (the one lock order), checked, the amount reserved, the refund
   * inserted pending with its outbound key, the bound on its first attempt, the recovery point. A lasting refusal (404,
   * 409, 422) completes the key as the stored answer; the provider's open breaker is thrown (① rolls back, the key is free).
   */
  private async createPendingRefund(
    key: LeasedKey,
    clientId: string,
    paymentId: string,
    amountMinor: number | undefined,
  ): Promise<AfterPhase1> {
    const [found] = isUUID(paymentId)
      ? await this.db.query<{ order_id: string; source: string }>(
          `SELECT order_id, source FROM payments WHERE id = $1 AND client_id = $2`,
          [paymentId, clientId],
        )
      : [];
    if (!found) return this.refuse(key, paymentNotFound(paymentId));
    // Once the payment is known: its source picks the breaker (a refund inherits its charge's test-token faults).
    const breaker = this.psp.chargeBreakerOpen({ clientId, source: found.source });
    if (breaker.open) throw providerUnavailable(breaker.retryAfterSeconds);
    const [order] = await this.db.query<{ status: OrderStatus }>(`SELECT status FROM orders WHERE id = $1 FOR UPDATE`, [found.order_id]);
    const [payment] = await this.db.query<PaymentRow>(`SELECT ${PAYMENT_COLUMNS} FROM payments WHERE id = $1 FOR UPDATE`, [paymentId]);
    if (payment.status !== 'succeeded' || order.status !== 'cancelled')
      return this.refuse(key, refundNotAllowed(paymentId, payment.status, order.status));
    const refundable = Number(payment.amount_minor) - Number(payment.refunded_minor);
    const amount = amountMinor ?? refundable;
    const [reserved] = amount > 0 ? await this.db.query(RESERVE_REFUND, [paymentId, amount]) : [];
    if (!reserved) return this.refuse(key, refundExceedsPayment(paymentId, amount, refundable));
    const [inserted] = await this.db.query<RefundRow>(
      `INSERT INTO refunds (id, client_id, payment_id, idempotency_key_id, amount_minor, outbound_key)
       SELECT g.id, $1, $2, $3, $4, $5 || g.id FROM (SELECT gen_random_uuid() AS id) g
       RETURNING ${REFUND_COLUMNS}`,
      [clientId, paymentId, key.id, amount, outboundKeyOf('refund', '')],
    );
    // This holder calls the provider only before its lease ends: the bound every later "never reached" waits out.
    await this.attempts.firstAttempt('refunds', inserted.id, key.id);
    await this.phases.setRecoveryPoint(key, REFUND_CREATED);
    return { key, refund: { ...inserted, charge_id: payment.provider_transaction_id!, charge_source: payment.source }, resumed: false };
  }

  /** A lasting refusal in ②: completes the key with it, in ①'s transaction, so every retry replays it. */
  private async refuse(key: LeasedKey, problem: ProblemException): Promise<AfterPhase1> {
    const response = problemResponse(problem);
    await this.phases.complete(key.id, response);
    return { answer: { response, replayed: false } };
  }

  /** A resumed key's refund, inserted with it in ②, as it is now, with the charge it refunds. */
  private async refundOfKey(key: LeasedKey): Promise<RefundToSend> {
    const [refund] = await this.db.query<RefundToSend>(
      `SELECT ${prefixed('r', REFUND_COLUMNS)}, p.provider_transaction_id AS charge_id, p.source AS charge_source
         FROM refunds r JOIN payments p ON p.id = r.payment_id WHERE r.idempotency_key_id = $1`,
      [key.id],
    );
    if (!refund) throw new Error(`refund key ${key.id} is unfinished but has no refund`);
    return refund;
  }

  /** ③'s call: the refund under its outbound key, stopped by the holder's deadline (`earlierAttempt`: as for a charge). */
  private async sendRefund(refund: RefundToSend, key: LeasedKey, earlierAttempt: boolean): Promise<ProviderOutcome | undefined> {
    const result = await this.psp.createRefund(
      {
        chargeId: refund.charge_id,
        amountMinor: Number(refund.amount_minor),
        metadata: { refundId: refund.id, paymentId: refund.payment_id },
      },
      refund.outbound_key,
      key.deadline,
      { clientId: refund.client_id, source: refund.charge_source },
    );
    return refundOutcome(result, earlierAttempt);
  }

  /** ③ of a resumed key: what the provider has for this refund; undefined when nothing, or when it cannot be asked. */
  private lookUpRefund(refund: RefundToSend): Promise<ProviderOutcome | undefined> {
    return this.psp
      .findRefundsByRefund(refund.id, { paymentId: refund.payment_id, amountMinor: Number(refund.amount_minor) })
      .then(foundRefundOutcome)
      .catch((err: unknown) => {
        if (err instanceof PspUnreachableError) return undefined;
        throw err;
      });
  }

  /** What a refund no longer pending already says, to be answered as it is. */
  private recorded(refund: RefundRow): ProviderOutcome {
    return recordedOutcome(refund.status, refund.provider_refund_id, refund.failure_code);
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
