import { Injectable, Logger } from '@nestjs/common';
import { Counter, Gauge, Registry } from 'prom-client';
import { Database } from '@idempotent-orders/idempotency';

/**
 * Oldest pending payment, refund and late-charge refund, in one statement. Each reads min(created_at)
 * from a partial index holding only the pending rows (migration 1764414700000): one probe per kind.
 */
const OLDEST_PENDING = `
  SELECT extract(epoch FROM now() - (SELECT min(created_at) FROM payments WHERE status = 'pending'))::float8 AS payment,
         extract(epoch FROM now() - (SELECT min(created_at) FROM refunds WHERE status = 'pending'))::float8 AS refund,
         extract(epoch FROM now() - (SELECT min(created_at) FROM late_charge_refunds WHERE status = 'pending'))::float8 AS late_refund`;

/** Attempts after which a late charge's refund that is still unsettled is alerted (once) and counted as overdue. */
export const LATE_REFUND_ALERT_ATTEMPTS = 5;

/** Pending late-charge refunds, still retrying or past the alert bound: few rows, all in ix_late_charge_refunds_pending. */
const LATE_REFUNDS_PENDING = `
  SELECT count(*) FILTER (WHERE attempts < $1)::int AS retrying, count(*) FILTER (WHERE attempts >= $1)::int AS overdue
    FROM late_charge_refunds WHERE status = 'pending'`;

/** What the payments module counts beyond the outbound client: money that landed where we did not expect it. */
@Injectable()
export class PaymentMetrics {
  private readonly logger = new Logger('PaymentMetrics');
  readonly lateChargeRefunds: Counter<'outcome'>;
  readonly lateLandings: Counter<'kind' | 'found_by'>;
  readonly ordersOfLostPayments: Counter<'repair'>;

  constructor(registry: Registry, db: Database) {
    this.lateChargeRefunds = new Counter({
      name: 'payments_late_charge_refunds_total',
      help:
        'Charges the provider made for a payment we had failed, refunded automatically: requested (once per charge), then per attempt ' +
        'succeeded, declined, refused, or unknown (retried under the same outbound key)',
      labelNames: ['outcome'],
      registers: [registry],
    });
    this.lateLandings = new Counter({
      name: 'payments_late_landings_total',
      help:
        'Money the provider moved on a payment (kind=charge) or refund (kind=refund) we held as failed or already settled, repaired; ' +
        'kind=second_refund: a second provider refund for a refund already settled, alerted (only a person can take it back); ' +
        'kind=charge_of_lost_payment: a charge for a payment our database does not have (lost in a failover), refunded; ' +
        'kind=unknown_refund: a provider refund our database does not have, alerted: ' +
        'found_by webhook, settler (a request, retry or reconciler holding a confirmed answer), sweep (the recheck of failed-unreachable rows) ' +
        "or provider_sweep (the listing of the provider's recent charges)",
      labelNames: ['kind', 'found_by'],
      registers: [registry],
    });
    this.ordersOfLostPayments = new Counter({
      name: 'payments_lost_payment_orders_total',
      help:
        'The order of a payment lost in a failover, once its charge is found: repair=voided (the order is gone too: order.voided ' +
        'sent, consumers undo what they did), paid (paid meanwhile by a retry: nothing to undo), alerted (it exists and is not ' +
        'paid: what was done on its lost order.paid needs a person; logged with alert)',
      labelNames: ['repair'],
      registers: [registry],
    });
    const lateRefundsPending: Gauge<'state'> = new Gauge({
      name: 'payments_late_charge_refunds_pending',
      help:
        'Refunds of late charges not settled yet (the customer paid twice meanwhile): state=retrying, or overdue once past ' +
        `${LATE_REFUND_ALERT_ATTEMPTS} attempts (alerted in the log); read at scrape time`,
      labelNames: ['state'],
      registers: [registry],
      collect: async () => {
        try {
          const [row] = await db.query<{ retrying: number; overdue: number }>(LATE_REFUNDS_PENDING, [LATE_REFUND_ALERT_ATTEMPTS]);
          lateRefundsPending.set({ state: 'retrying' }, row.retrying);
          lateRefundsPending.set({ state: 'overdue' }, row.overdue);
        } catch (err) {
          this.logger.warn({ err }, 'could not read the pending late-charge refunds for /metrics');
        }
      },
    });
    // Computed at scrape time rather than by the reconciler: the gauge is there to show that
    // settling has stalled, so it must not depend on the reconciler running (it may be off, or stuck).
    const oldest: Gauge<'kind'> = new Gauge({
      name: 'payments_oldest_pending_seconds',
      help: 'Age of the oldest pending payment, refund and late-charge refund (0 when none is pending)',
      labelNames: ['kind'],
      registers: [registry],
      collect: async () => {
        try {
          const [row] = await db.query<{ payment: number | null; refund: number | null; late_refund: number | null }>(OLDEST_PENDING);
          oldest.set({ kind: 'payment' }, row.payment ?? 0);
          oldest.set({ kind: 'refund' }, row.refund ?? 0);
          oldest.set({ kind: 'late_refund' }, row.late_refund ?? 0);
        } catch (err) {
          // A scrape while the database is away still returns every other metric; this one keeps its last value.
          this.logger.warn({ err }, 'could not read the oldest pending payment for /metrics');
        }
      },
    });
  }
}
