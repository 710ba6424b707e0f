import { Injectable } from '@nestjs/common';
import { isUUID } from 'class-validator';
import { AtomicPhases, Database, type KeyScope, type LeasedKey, problemResponse } from '@idempotent-orders/idempotency';
import type { KeyAnswer } from '../common/idempotent-endpoint.js';
import { orderNotFound } from '../orders/orders.service.js';
import type { OrderStatus } from '../orders/order-status.js';
import { PspClient, PspUnreachableError } from '../psp-client/psp-client.js';
import type { PaymentView } from './dto/payment.view.js';
import {
  nothingToPay,
  orderNotPayable,
  paymentInProgress,
  paymentNotFound,
  paymentPending,
  providerUnavailable,
} from './payment-problems.js';
import { outboundKeyOf, PAYMENT_COLUMNS, PAYMENT_CREATED, type PaymentRow, prefixed, toPaymentView } from './payment-records.js';
import { PaymentReconciler } from './payment-reconciler.js';
import { PaymentSettlement, type ProviderOutcome } from './payment-settlement.js';
import { ProviderAttempts } from './provider-attempts.js';
import { DeploymentId } from './deployment-id.js';
import { chargeOutcome, foundChargeOutcome, recordedOutcome } from './provider-outcomes.js';
import { ProblemException, problemType } from '#service-kit';

/** Where phase 1 leaves a request: answered already, or holding the key's lease with the payment to charge. */
type AfterPhase1 = { answer: KeyAnswer } | { key: LeasedKey; payment: PaymentRow; resumed: boolean };

/**
 * POST /orders/:id/payments in atomic phases (docs/patterns/phased-external-calls.md), the shape of brandur's
 * rocket-rides-atomic: `payOrder` is the whole sequence, top to bottom; every other method here is one step of it.
 *
 *   ① claim the key, with a lease      ┐ ONE transaction: both commit or neither does
 *   ② insert the pending payment       ┘ → recovery point `payment_created`
 *   ③ call the provider                  no transaction open
 *   ④ settle the payment under the lease ┐ ONE transaction (PaymentSettlement)
 *   ⑤ complete the key with the answer   ┘ → recovery point `finished`
 *
 * A key is only ever committed unfinished at `payment_created`: that is where a resumed request re-enters (③).
 */
@Injectable()
export class PaymentsService {
  constructor(
    private readonly db: Database,
    private readonly phases: AtomicPhases,
    private readonly psp: PspClient,
    private readonly attempts: ProviderAttempts,
    private readonly settlement: PaymentSettlement,
    private readonly reconciler: PaymentReconciler,
    private readonly deploymentId: DeploymentId,
  ) {}

  async payOrder(scope: KeyScope, orderId: string, source: string): Promise<KeyAnswer> {
    try {
      return await this.pay(scope, orderId, source);
    } catch (err) {
      // Another key's payment of this order is pending (only ② says so, and rolls ① back: this key stays free). If that
      // key's request is gone (its lease ran out), settle its payment first, then try once more.
      const stale =
        err instanceof ProblemException &&
        err.problem.type === problemType('payment-in-progress') &&
        typeof err.problem.paymentId === 'string';
      if (!stale || !(await this.reconciler.reconcileStalePayment(err.problem.paymentId as string))) throw err;
      return this.pay(scope, orderId, source);
    }
  }

  private async pay(scope: KeyScope, orderId: string, source: string): Promise<KeyAnswer> {
    // ① + ②, one transaction. Dies in it: PostgreSQL rolls both back — no key, no payment, nothing sent; a retry starts afresh.
    const phase1 = await this.db.transaction(async (): Promise<AfterPhase1> => {
      const acquired = await this.phases.acquire(scope); // ① 409 while another request holds the lease, 422 for another body
      switch (acquired.kind) {
        case 'completed': // finished earlier: its stored answer, byte for byte
          return { answer: { response: acquired.response, replayed: true } };
        case 'resumed': // an earlier holder's lease ran out: re-enter at its recovery point
          return { key: acquired.key, payment: await this.paymentOfKey(acquired.key), resumed: true };
        case 'claimed': // new: ② in this same transaction
          return this.createPendingPayment(acquired.key, scope.clientId, orderId, source);
      }
    });
    if ('answer' in phase1) return phase1.answer;
    const { key, payment, resumed } = phase1;

    // Where the request goes on is the recovery point its key is committed at. ① and ② commit together and ④+⑤ end at
    // `finished` (a completed key, answered above), so `payment_created` is the only point a key is ever left unfinished at:
    // a new key has just committed it, a resumed one re-enters at it. A new phase would be a new point and a new case.
    switch (key.recoveryPoint) {
      case PAYMENT_CREATED: {
        // ③ The provider call, outside any transaction. Dies here (before, during or after the call): the key stays
        // `payment_created` under a lease that runs out; then the client's retry (or the reconciler) takes it over and
        // re-enters here, asks the provider what became of `payment_<id>`, and re-sends under that same outbound key
        // only if it has nothing — the provider dedupes, so the card is charged at most once.
        let outcome: ProviderOutcome | undefined;
        if (!resumed) {
          outcome = await this.sendCharge(payment, key, false);
        } else if (payment.status === 'pending' && !this.attempts.mayResend(payment.created_at)) {
          // Past the re-send window (ProviderAttempts.mayResend) nothing more is sent: decided by lookups, as the
          // reconciler decides (it settles and completes the key, ④ and ⑤, under this request's lease).
          const decided = await this.reconciler.decide(key);
          if (decided) return { response: decided.response, replayed: false };
          throw paymentPending(payment.id);
        } else {
          outcome = await this.lookUpCharge(payment);
          // Nothing at the provider yet: send again, after raising the bound on our last attempt (false: lease lost).
          if (!outcome && payment.status === 'pending' && (await this.attempts.resending('payments', payment.id, key)))
            outcome = await this.sendCharge(payment, key, true);
        }
        if (!outcome && payment.status === 'pending') {
          // Unknown (a timeout, a 5xx): never final. The attempt's bound comes down to now and the lease is given back,
          // so the retry this 503 asks for resumes at once. Dies before that: the lease runs out instead.
          await this.attempts.gaveUp(payment.id, key);
          throw paymentPending(payment.id);
        }
        // ④ + ⑤, one transaction: the conditional UPDATE of the payment (and the order to paid) and the key completed
        // with the answer — fenced by this holder's lease token. Dies in it: rolled back, the lease runs out, and the
        // next holder asks the provider again and settles the same way. A payment settled meanwhile (a webhook) is
        // answered from the row.
        const settled = await this.settlement.settlePayment(payment.id, outcome ?? this.recorded(payment), key.leaseToken);
        // Our lease ran out and another holder took the key over: it settles and answers.
        if (settled.kind === 'lost') throw paymentPending(payment.id);
        return { response: settled.response, replayed: false };
      }
      default:
        throw new Error(`payment key ${key.id} is at recovery point ${key.recoveryPoint}, which this build does not know`);
    }
  }

  /**
   * ②, in ①'s transaction: the order locked (FOR UPDATE, the first lock after the key), checked, the payment inserted
   * pending with its outbound key, the bound on its first attempt (the lease's end), the recovery point. A refusal that
   * stays true (404, 409 not payable) completes the key as the stored answer; a temporary one (the provider's breaker is
   * open, another payment in progress) is thrown, which rolls ① back and leaves the key free.
   */
  private async createPendingPayment(key: LeasedKey, clientId: string, orderId: string, source: string): Promise<AfterPhase1> {
    const breaker = this.psp.chargeBreakerOpen({ clientId, source });
    if (breaker.open) throw providerUnavailable(breaker.retryAfterSeconds);
    const [order] = isUUID(orderId)
      ? await this.db.query<{ status: OrderStatus; total_minor: string; currency: string }>(
          `SELECT status, total_minor, currency FROM orders WHERE id = $1 AND client_id = $2 FOR UPDATE`,
          [orderId, clientId],
        )
      : [];
    if (!order) return this.refuse(key, orderNotFound(orderId));
    if (order.status !== 'created') return this.refuse(key, orderNotPayable(orderId, order.status));
    if (Number(order.total_minor) === 0) return this.refuse(key, nothingToPay(orderId));
    // The partial unique index decides, under the order's lock: a payment already active (pending, or succeeded
    // on an order that somehow is still 'created') makes the insert do nothing, and is then named in the 409.
    const [payment] = await this.db.query<PaymentRow>(
      `INSERT INTO payments (id, client_id, order_id, idempotency_key_id, amount_minor, currency, source, outbound_key)
       SELECT g.id, $1, $2, $3, $4, $5, $6, $7 || g.id FROM (SELECT gen_random_uuid() AS id) g
       ON CONFLICT (order_id) WHERE status IN ('pending', 'succeeded') DO NOTHING
       RETURNING ${PAYMENT_COLUMNS}`,
      [clientId, orderId, key.id, order.total_minor, order.currency, source, outboundKeyOf('payment', '')],
    );
    if (!payment) {
      const [active] = await this.db.query<{ id: string }>(
        `SELECT id FROM payments WHERE order_id = $1 AND status IN ('pending', 'succeeded')`,
        [orderId],
      );
      throw paymentInProgress(active?.id ?? 'unknown');
    }
    // This holder calls the provider only before its lease ends: the bound every later "never reached" waits out.
    await this.attempts.firstAttempt('payments', payment.id, key.id);
    await this.phases.setRecoveryPoint(key, PAYMENT_CREATED);
    return { key, payment, resumed: false };
  }

  /** A lasting refusal in ②: completes the key with it, in ①'s transaction, so every retry replays it. */
  private async refuse(key: LeasedKey, problem: ProblemException): Promise<AfterPhase1> {
    const response = problemResponse(problem);
    await this.phases.complete(key.id, response);
    return { answer: { response, replayed: false } };
  }

  /** A resumed key's payment, inserted with it in ②, as it is now (a webhook may have settled it). */
  private async paymentOfKey(key: LeasedKey): Promise<PaymentRow> {
    const [payment] = await this.db.query<PaymentRow>(`SELECT ${PAYMENT_COLUMNS} FROM payments WHERE idempotency_key_id = $1`, [key.id]);
    if (!payment) throw new Error(`payment key ${key.id} is unfinished but has no payment`);
    return payment;
  }

  /**
   * ③'s call: the charge under the payment's outbound key, stopped by the holder's deadline (before its lease ends).
   * `earlierAttempt`: a resumed key's re-send, so a refusal may be the provider seeing an attempt still on its way (unknown).
   */
  private async sendCharge(payment: PaymentRow, key: LeasedKey, earlierAttempt: boolean): Promise<ProviderOutcome | undefined> {
    const result = await this.psp.createCharge(
      {
        amountMinor: Number(payment.amount_minor),
        currency: payment.currency,
        source: payment.source,
        metadata: { orderId: payment.order_id, paymentId: payment.id, deploymentId: this.deploymentId.value },
      },
      payment.outbound_key,
      key.deadline,
      payment.client_id,
    );
    return chargeOutcome(result, earlierAttempt);
  }

  /** ③ of a resumed key: what the provider has for this payment; undefined when nothing, or when it cannot be asked. */
  private lookUpCharge(payment: PaymentRow): Promise<ProviderOutcome | undefined> {
    return this.psp
      .findChargesByPayment(payment.id, { amountMinor: Number(payment.amount_minor), currency: payment.currency })
      .then(foundChargeOutcome)
      .catch((err: unknown) => {
        if (err instanceof PspUnreachableError) return undefined;
        throw err;
      });
  }

  /** What a payment no longer pending already says, to be answered as it is. */
  private recorded(payment: PaymentRow): ProviderOutcome {
    return recordedOutcome(payment.status, payment.provider_transaction_id, payment.failure_code);
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
