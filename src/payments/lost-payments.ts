import { Injectable, Logger } from '@nestjs/common';
import { Database } from '@idempotent-orders/idempotency';
import { INSERT_ORDER_VOIDED_IF_MISSING } from '../events/order-events-outbox.js';
import { DeploymentId } from './deployment-id.js';
import { type FoundBy, LateChargeRefunder } from './late-charge-refunder.js';
import { PaymentMetrics } from './payment-metrics.js';

/** A succeeded charge at the provider, as its webhook or its listing tells it. */
export interface ProviderCharge {
  chargeId: string;
  /** metadata.paymentId and metadata.orderId: ours, given when the charge was made (madeHere checks its metadata.deploymentId). */
  paymentId: string;
  orderId: string;
  amountMinor: number;
  currency: string;
}

/** Statuses an order has only after its payment succeeded (the order state machine). */
const PAID_OR_LATER = ['paid', 'shipped', 'delivered', 'refunded'];

/**
 * Money at the provider for a payment our database does not have. With asynchronous replication a failover loses the
 * last commits: a payment whose charge went out can vanish, and with it, perhaps, its order, whose `order.paid` the
 * relay may already have published. No order is paid by that charge, so under the rule "money taken iff the order is
 * paid" it is refunded (like a late charge, under the key late_<chargeId>); a client's retry pays afresh. And its order:
 * - gone too: `order.voided` is written to the outbox, so fulfilment cancels what it shipped;
 * - paid (by the retry): nothing to undo;
 * - there and not paid: whatever a consumer did on the lost `order.paid` (whose version the order will reuse) cannot be
 *   undone by an event; alerted in the log and counted (payments_lost_payment_orders_total{repair="alerted"}).
 * Found by the provider's webhook (WebhooksService) and by the sweep of recent charges (ProviderChargeSweep), each
 * charge once: the late refund's unique charge id decides between them.
 */
@Injectable()
export class LostPayments {
  private readonly logger = new Logger('LostPayments');

  constructor(
    private readonly db: Database,
    private readonly lateRefunds: LateChargeRefunder,
    private readonly metrics: PaymentMetrics,
    private readonly deployment: DeploymentId,
  ) {}

  /**
   * Whether a charge carrying this metadata.deploymentId was made here. Only those are ours to repair: a charge of
   * another deployment on the same provider account (or of another service, which sends none) is theirs.
   */
  madeHere(deploymentId: unknown): boolean {
    return deploymentId === this.deployment.value;
  }

  /**
   * In the finder's transaction, after it found no payment `charge.paymentId` and `madeHere` said the charge is ours.
   * The late refund's id, for `refundInBackground` after the commit; undefined when this charge was repaired before.
   */
  async repair(charge: ProviderCharge, foundBy: FoundBy): Promise<string | undefined> {
    const lateRefundId = await this.lateRefunds.requestRefundOfLostPayment(charge.paymentId, charge.chargeId, charge.amountMinor, foundBy);
    if (!lateRefundId) return undefined;
    const log = { orderId: charge.orderId, lostPaymentId: charge.paymentId, chargeId: charge.chargeId };
    const [order] = await this.db.query<{ status: string }>(`SELECT status FROM orders WHERE id = $1`, [charge.orderId]);
    if (!order) {
      // At most one per order: a second lost payment of the same lost order finds its event written.
      await this.db.query(INSERT_ORDER_VOIDED_IF_MISSING, [charge.orderId, charge.amountMinor, charge.currency]);
      this.metrics.ordersOfLostPayments.inc({ repair: 'voided' });
      this.logger.warn(log, 'the order of a lost payment is gone too: order.voided sent');
      return lateRefundId;
    }
    if (PAID_OR_LATER.includes(order.status)) {
      this.metrics.ordersOfLostPayments.inc({ repair: 'paid' });
      return lateRefundId;
    }
    this.metrics.ordersOfLostPayments.inc({ repair: 'alerted' });
    this.logger.error(
      { ...log, orderStatus: order.status, alert: true },
      'the order of a lost payment is not paid: check what consumers did on an order.paid for it',
    );
    return lateRefundId;
  }
}
