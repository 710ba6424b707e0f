import { Injectable, Logger, type OnModuleDestroy, type OnModuleInit } from '@nestjs/common';
import { Database, monotonicNow } from '@idempotent-orders/idempotency';
import { LEASE_MARGIN_MS } from '../config/app-config.js';
import { type PspCallResult, PspClient, type PspRefund } from '../psp-client/psp-client.js';
import { LATE_REFUND_ALERT_ATTEMPTS, PaymentMetrics } from './payment-metrics.js';

/**
 * An attempt claims its row until then: another instance (or the retry job) does not call the
 * provider for it meanwhile, and a call whose outcome stays unknown is tried again after it.
 * A minute covers the outbound client's whole retry budget.
 */
export const LATE_REFUND_ATTEMPT_SECONDS = 60;
/** Rows retried per round of the job: each is one provider call. */
const RETRY_BATCH = 20;
/**
 * The job's own tick, whatever RECONCILE_INTERVAL_MS is (0 included): a late charge is money taken twice from a
 * customer, so its refund is retried until settled even where nothing else runs in the background. A tick is one
 * indexed look at the pending rows that are due.
 */
export const LATE_REFUND_TICK_MS = 2_000;
/** After an attempt whose outcome is unknown: the next one this long after, doubling per attempt, up to LATE_REFUND_RETRY_MAX_SECONDS. */
export const LATE_REFUND_RETRY_FIRST_SECONDS = 5;
export const LATE_REFUND_RETRY_MAX_SECONDS = 600;
/** Shutdown waits this long at most for a call in flight; its outcome is then learnt by the next attempt under the same key. */
const STOP_WAIT_MS = 3_000;

interface LateRefundRow {
  id: string;
  charge_id: string;
  /** The payment's id, or the lost payment's (metadata.paymentId of the charge). */
  payment_id: string;
  amount_minor: string;
  outbound_key: string;
  attempts: number;
  /** The late charge's payment: its client and its source pick the refund's breaker (PspClient). */
  client_id: string;
  source: string;
}

/** The key the provider dedupes a late charge's refund on: derived from the charge, so every attempt, on any instance, is one refund. */
export const lateRefundKeyOf = (chargeId: string) => `late_${chargeId}`;

/** Who found a charge that landed where we did not expect it (a label of payments_late_landings_total). */
export type FoundBy = 'webhook' | 'settler' | 'sweep' | 'provider_sweep';

/**
 * Gives back the money of a charge the provider made after we had failed its payment (or a second
 * charge of a succeeded one). Whoever finds it — the webhook, a settler holding the provider's
 * confirmation, the sweep of failed-unreachable payments — records the refund as pending in its own
 * transaction (`requestRefund`, once per charge); this calls the provider after that commit, outside any
 * transaction, under the outbound key `late_<chargeId>`.
 * An unknown outcome leaves the row pending: the job retries it on its own tick (LATE_REFUND_TICK_MS, whatever
 * RECONCILE_INTERVAL_MS is) at doubling intervals under the same key (the provider answers with the same refund),
 * until it is settled; past LATE_REFUND_ALERT_ATTEMPTS attempts it alerts once (payments_late_charge_refunds_pending
 * shows it meanwhile). The provider's refund.* webhook for it (metadata.refundId = this row's id) settles it too.
 */
@Injectable()
export class LateChargeRefunder implements OnModuleInit, OnModuleDestroy {
  private readonly logger = new Logger('LateChargeRefunder');
  private readonly inFlight = new Set<Promise<unknown>>();
  private timer?: NodeJS.Timeout;

  constructor(
    private readonly db: Database,
    private readonly psp: PspClient,
    private readonly metrics: PaymentMetrics,
  ) {}

  onModuleInit(): void {
    this.timer = setInterval(() => {
      if (this.inFlight.size === 0) this.track(this.retryDue());
    }, LATE_REFUND_TICK_MS);
    this.timer.unref();
  }

  /**
   * Shutdown waits for calls in flight, so none writes into a closed pool, but not past STOP_WAIT_MS: a call still
   * out then has claimed its row, and the next attempt after the claim (any instance) learns its outcome.
   */
  async onModuleDestroy(): Promise<void> {
    clearInterval(this.timer);
    let timer: NodeJS.Timeout | undefined;
    const waited = new Promise<void>((resolve) => (timer = setTimeout(resolve, STOP_WAIT_MS)));
    await Promise.race([Promise.allSettled([...this.inFlight]), waited]);
    clearTimeout(timer);
  }

  /**
   * In the finder's transaction: the pending refund of a late charge, once per charge (the unique charge id
   * decides between finders). Its id, for `refundInBackground` after the commit; undefined when already recorded.
   */
  async requestRefund(paymentId: string, chargeId: string, amountMinor: number, foundBy: FoundBy): Promise<string | undefined> {
    const id = await this.insertPending({ paymentId, lostPaymentId: null }, chargeId, amountMinor);
    if (!id) return undefined;
    this.metrics.lateLandings.inc({ kind: 'charge', found_by: foundBy });
    this.logger.warn({ paymentId, chargeId, amountMinor, foundBy }, 'a charge landed on a payment we had given up: refunding it');
    return id;
  }

  /**
   * As requestRefund, for a charge whose payment we do not have (metadata.paymentId unknown here): a failover with
   * asynchronous replication lost the payment after its charge went out. No order is paid by it, so the money goes back.
   */
  async requestRefundOfLostPayment(
    lostPaymentId: string,
    chargeId: string,
    amountMinor: number,
    foundBy: FoundBy,
  ): Promise<string | undefined> {
    const id = await this.insertPending({ paymentId: null, lostPaymentId }, chargeId, amountMinor);
    if (!id) return undefined;
    this.metrics.lateLandings.inc({ kind: 'charge_of_lost_payment', found_by: foundBy });
    this.logger.error(
      { lostPaymentId, chargeId, amountMinor, foundBy, alert: true },
      'the provider charged a payment our database does not have (lost in a failover?): refunding it',
    );
    return id;
  }

  private async insertPending(
    payment: { paymentId: string; lostPaymentId: null } | { paymentId: null; lostPaymentId: string },
    chargeId: string,
    amountMinor: number,
  ): Promise<string | undefined> {
    const [recorded] = await this.db.query<{ id: string }>(
      `INSERT INTO late_charge_refunds (charge_id, payment_id, lost_payment_id, amount_minor, outbound_key) VALUES ($1, $2, $3, $4, $5)
       ON CONFLICT (charge_id) DO NOTHING
       RETURNING id`,
      [chargeId, payment.paymentId, payment.lostPaymentId, amountMinor, lateRefundKeyOf(chargeId)],
    );
    if (recorded) this.metrics.lateChargeRefunds.inc({ outcome: 'requested' });
    return recorded?.id;
  }

  /** Starts the refund without holding up the finder's answer: the pending row is the durable record. */
  refundInBackground(id: string): void {
    this.track(this.attempt(id));
  }

  /** Every pending refund that is due; returns how many were attempted. */
  async retryDue(): Promise<number> {
    const due = await this.db.query<{ id: string }>(
      `SELECT id FROM late_charge_refunds WHERE status = 'pending' AND next_attempt_at <= now() ORDER BY next_attempt_at LIMIT $1`,
      [RETRY_BATCH],
    );
    let attempted = 0;
    for (const { id } of due) if (await this.attempt(id)) attempted++;
    return attempted;
  }

  /** One provider call for a pending late refund; false when it is settled or another attempt holds it. */
  async attempt(id: string): Promise<boolean> {
    // The claim is a conditional UPDATE: of two instances (or the webhook and the job), one calls. A lost payment has
    // no client or source: its refund goes through the shared breaker.
    const [row] = await this.db.query<LateRefundRow>(
      `WITH claimed AS (
         UPDATE late_charge_refunds
            SET attempts = attempts + 1, next_attempt_at = now() + make_interval(secs => $2), updated_at = now()
          WHERE id = $1 AND status = 'pending' AND next_attempt_at <= now()
         RETURNING id, charge_id, payment_id, lost_payment_id, amount_minor, outbound_key, attempts)
       SELECT c.id, c.charge_id, coalesce(c.payment_id, c.lost_payment_id) AS payment_id, c.amount_minor, c.outbound_key, c.attempts,
              coalesce(p.client_id, '') AS client_id, coalesce(p.source, '') AS source
         FROM claimed c LEFT JOIN payments p ON p.id = c.payment_id`,
      [id, LATE_REFUND_ATTEMPT_SECONDS],
    );
    if (!row) return false;
    const deadline = monotonicNow() + LATE_REFUND_ATTEMPT_SECONDS * 1000 - LEASE_MARGIN_MS;
    let result: PspCallResult<PspRefund>;
    try {
      result = await this.psp.createRefund(
        { chargeId: row.charge_id, amountMinor: Number(row.amount_minor), metadata: { refundId: row.id, paymentId: row.payment_id } },
        row.outbound_key,
        deadline,
        { clientId: row.client_id, source: row.source },
      );
    } catch (err) {
      result = { kind: 'unknown', reason: err instanceof Error ? err.message : String(err) };
    }
    await this.record(row, result);
    return true;
  }

  private async record(row: LateRefundRow, result: PspCallResult<PspRefund>): Promise<void> {
    const log = { lateRefundId: row.id, chargeId: row.charge_id, paymentId: row.payment_id };
    switch (result.kind) {
      case 'succeeded':
      case 'declined': {
        const status = result.kind === 'succeeded' ? 'succeeded' : 'failed';
        await this.settle(row.id, status, result.value.id, result.value.failureCode ?? (status === 'failed' ? 'refund_declined' : null));
        this.metrics.lateChargeRefunds.inc({ outcome: result.kind });
        if (status === 'failed')
          this.logger.error({ ...log, alert: true }, 'the provider declined the refund of a late charge: refund it by hand');
        else this.logger.log(log, 'late charge refunded');
        return;
      }
      case 'refused':
        // After an earlier attempt whose outcome is unknown, a refusal does not say that one did not land: still unknown.
        if (row.attempts > 1) return this.unknown(row, log, result);
        await this.settle(row.id, 'failed', null, 'provider_refused');
        this.metrics.lateChargeRefunds.inc({ outcome: 'refused' });
        this.logger.error(
          { ...log, alert: true, status: result.status, detail: result.detail },
          'the provider refused the refund of a late charge: refund it by hand',
        );
        return;
      default:
        return this.unknown(row, log, result);
    }
  }

  /** Not known whether it was refunded: stays pending, tried again under the same key after the backoff; alerted once past the bound. */
  private async unknown(row: LateRefundRow, log: Record<string, string>, result: PspCallResult<PspRefund>): Promise<void> {
    const retryInSeconds = Math.min(LATE_REFUND_RETRY_MAX_SECONDS, LATE_REFUND_RETRY_FIRST_SECONDS * 2 ** Math.min(row.attempts - 1, 16));
    // Only while this attempt's claim stands (no later claim has counted another attempt); the backoff replaces the
    // claim's end, so it can grow past the claim's minute to the maximum.
    await this.db.query(
      `UPDATE late_charge_refunds SET next_attempt_at = now() + make_interval(secs => $2), updated_at = now()
        WHERE id = $1 AND status = 'pending' AND attempts = $3`,
      [row.id, retryInSeconds, row.attempts],
    );
    this.metrics.lateChargeRefunds.inc({ outcome: 'unknown' });
    const fields = { ...log, attempts: row.attempts, retryInSeconds, result };
    if (row.attempts === LATE_REFUND_ALERT_ATTEMPTS) {
      this.logger.error(
        { ...fields, alert: true },
        'a late charge is still not refunded after many attempts: the customer paid twice; check the provider',
      );
    } else {
      this.logger.warn(fields, 'late charge refund outcome unknown; will retry under the same outbound key');
    }
  }

  /** Settles the row once, whoever learns the outcome first (this call, a retry, the provider's refund webhook). */
  async settle(id: string, status: 'succeeded' | 'failed', providerRefundId: string | null, failureCode: string | null): Promise<boolean> {
    const rows = await this.db.query(
      `UPDATE late_charge_refunds
          SET status = $2, provider_refund_id = coalesce($3, provider_refund_id), failure_code = $4, updated_at = now()
        WHERE id = $1 AND status = 'pending'
       RETURNING id`,
      [id, status, providerRefundId, failureCode],
    );
    return rows.length === 1;
  }

  private track(work: Promise<unknown>): void {
    const tracked = work.catch((err: unknown) => this.logger.error({ err }, 'late charge refund failed; will retry when due'));
    this.inFlight.add(tracked);
    void tracked.finally(() => this.inFlight.delete(tracked));
  }
}
