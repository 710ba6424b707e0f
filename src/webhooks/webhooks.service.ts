import { Inject, Injectable, Logger } from '@nestjs/common';
import type { IncomingHttpHeaders } from 'node:http';
import type { AppConfig } from '../config/app-config.js';
import { APP_CONFIG } from '../config/config.module.js';
import { Database } from '@idempotent-orders/idempotency';
import { ProblemException, retryOnceOnDeadlock } from '#service-kit';
import type { PaymentStatus } from '../payments/payment.entity.js';
import { type ProviderOutcome, PaymentSettlement } from '../payments/payment-settlement.js';
import { LateChargeRefunder } from '../payments/late-charge-refunder.js';
import { LostPayments } from '../payments/lost-payments.js';
import { PaymentMetrics } from '../payments/payment-metrics.js';
import { type ChargeEventData, parsePspWebhookEvent, type PspWebhookEvent, type RefundEventData } from './psp-webhook-event.js';
import type { WebhookEffect } from './processed-webhook-event.entity.js';
import { WebhookMetrics } from './webhook-metrics.js';
import { WebhookSignatureError, WebhookSignatureVerifier } from './webhook-signature.js';

/** Longer ids than any provider sends cannot be a provider's, and would not fit a btree index entry. */
const MAX_WEBHOOK_ID = 255;

/** What one delivery did, as the provider (and whoever debugs it) is told. */
export interface WebhookReceipt {
  webhookId: string;
  /** duplicate: this event was processed before (or by a concurrent delivery); nothing was done again. */
  outcome: WebhookEffect | 'duplicate';
  detail: string;
}

interface Effect {
  outcome: WebhookEffect;
  detail: string;
  paymentId?: string;
  refundId?: string;
  /** A late charge whose refund was recorded pending: called once the transaction commits. */
  lateRefundId?: string;
  /** The provider and we disagree: someone must look. */
  alert?: boolean;
}

const applied = (detail: string, ids: Partial<Effect> = {}): Effect => ({ outcome: 'applied', detail, ...ids });
const noEffect = (detail: string, ids: Partial<Effect> = {}): Effect => ({ outcome: 'no_effect', detail, ...ids });

interface PaymentFacts {
  id: string;
  order_id: string;
  status: PaymentStatus;
  amount_minor: string;
  currency: string;
  provider_transaction_id: string | null;
}

interface RefundFacts {
  id: string;
  payment_id: string;
  order_id: string;
  status: PaymentStatus;
  amount_minor: string;
  currency: string;
  provider_refund_id: string | null;
}

/**
 * The idempotent consumer of the provider's at-least-once webhooks. A delivery is verified over its
 * exact bytes (Standard Webhooks), then its `webhook-id` is inserted into processed_webhook_events
 * in the SAME transaction as its effect: a redelivery — later, or at the same moment (its INSERT
 * waits for the first one's transaction) — finds the row and does nothing. Effects go through the
 * settlement every other settler uses (conditional UPDATEs, state machine, the key's answer), so an
 * old or out-of-order event never moves anything backwards. A database error rolls back the row
 * with the effect: the provider's redelivery applies it once.
 */
@Injectable()
export class WebhooksService {
  private readonly logger = new Logger('Webhooks');
  private readonly verifier: WebhookSignatureVerifier;

  constructor(
    private readonly db: Database,
    private readonly settlement: PaymentSettlement,
    private readonly lateRefunds: LateChargeRefunder,
    private readonly lostPayments: LostPayments,
    private readonly paymentMetrics: PaymentMetrics,
    private readonly metrics: WebhookMetrics,
    @Inject(APP_CONFIG) config: AppConfig,
  ) {
    this.verifier = new WebhookSignatureVerifier(config.pspWebhookSecret);
  }

  async receive(rawBody: Buffer, headers: IncomingHttpHeaders): Promise<WebhookReceipt> {
    this.metrics.events.inc({ outcome: 'received' });
    const webhookId = this.verify(rawBody, headers);
    const event = parsePspWebhookEvent(rawBody);
    const type = event.type;
    let effect: Effect | undefined;
    try {
      effect = await retryOnceOnDeadlock(() => this.db.transaction(() => this.process(webhookId, event)));
    } catch (err) {
      this.metrics.events.inc({ outcome: 'failed' });
      this.logger.error({ err, webhookId, type }, 'webhook not processed; nothing recorded, the provider will redeliver it');
      throw ProblemException.of(
        503,
        'webhook-not-processed',
        'Webhook not processed',
        'The event could not be processed right now and nothing was recorded: deliver it again.',
        { webhookId },
        { 'Retry-After': '1' },
      );
    }
    if (!effect) {
      this.metrics.events.inc({ outcome: 'duplicate' });
      this.logger.log({ webhookId, type, outcome: 'duplicate' }, 'webhook duplicate');
      return { webhookId, outcome: 'duplicate', detail: 'already processed' };
    }
    this.metrics.events.inc({ outcome: effect.outcome });
    const log = { webhookId, type, outcome: effect.outcome, detail: effect.detail, paymentId: effect.paymentId, refundId: effect.refundId };
    if (effect.alert) this.logger.error({ ...log, alert: true }, 'webhook disagrees with our records; recorded with no effect');
    // The success path: at debug, so that the default level writes nothing per webhook.
    else this.logger.debug(log, `webhook ${effect.outcome}`);
    if (effect.lateRefundId) this.lateRefunds.refundInBackground(effect.lateRefundId);
    return { webhookId, outcome: effect.outcome, detail: effect.detail };
  }

  /** The webhook id of a delivery the provider signed, within ±5 minutes; otherwise 401 and nothing recorded. */
  private verify(rawBody: Buffer, headers: IncomingHttpHeaders): string {
    const id = headers['webhook-id'];
    const timestamp = headers['webhook-timestamp'];
    const signature = headers['webhook-signature'];
    let webhookId: string;
    try {
      webhookId = this.verifier.verify(rawBody, { id, timestamp, signature });
    } catch (err) {
      if (!(err instanceof WebhookSignatureError)) throw err;
      this.metrics.events.inc({ outcome: 'rejected' });
      this.logger.warn(
        { webhookId: typeof id === 'string' ? id.slice(0, MAX_WEBHOOK_ID) : undefined, reason: err.message },
        'webhook rejected',
      );
      throw ProblemException.of(401, 'webhook-signature-invalid', 'Webhook signature not valid', `${err.message}: nothing was recorded.`);
    }
    if (webhookId.length > MAX_WEBHOOK_ID) {
      this.metrics.events.inc({ outcome: 'rejected' });
      throw ProblemException.of(
        400,
        'webhook-id-invalid',
        'webhook-id not accepted',
        `webhook-id must be 1 to ${MAX_WEBHOOK_ID} characters: nothing was recorded.`,
      );
    }
    return webhookId;
  }

  /** In one transaction: the processed row first (a concurrent redelivery waits on it), then the effect. Undefined for a duplicate. */
  private async process(webhookId: string, event: PspWebhookEvent): Promise<Effect | undefined> {
    const [claimed] = await this.db.query<{ webhook_id: string }>(
      `INSERT INTO processed_webhook_events (webhook_id, type, outcome, detail) VALUES ($1, $2, 'no_effect', 'processing')
       ON CONFLICT (webhook_id) DO NOTHING
       RETURNING webhook_id`,
      [webhookId, event.type],
    );
    if (!claimed) return undefined;
    const effect = await this.effectOf(event);
    // In the same transaction: the event and its outcome are recorded together, or not at all.
    await this.db.query(
      `UPDATE processed_webhook_events SET outcome = $2, detail = $3, payment_id = $4, refund_id = $5 WHERE webhook_id = $1`,
      [webhookId, effect.outcome, effect.detail, effect.paymentId ?? null, effect.refundId ?? null],
    );
    return effect;
  }

  private effectOf(event: PspWebhookEvent): Promise<Effect> {
    switch (event.kind) {
      case 'charge':
        return this.chargeEvent(event.type, event.data);
      case 'refund':
        return this.refundEvent(event.type, event.data);
      case 'unknown-type':
        return Promise.resolve(noEffect('unknown-type'));
      case 'malformed':
        // Signed by the provider, so redelivering it can never help: acknowledge it, and say so loudly.
        return Promise.resolve({ ...noEffect(`malformed: ${event.why}`), alert: true });
    }
  }

  private async chargeEvent(type: 'charge.succeeded' | 'charge.failed', data: ChargeEventData): Promise<Effect> {
    const ids = { paymentId: data.paymentId };
    let payment = await this.paymentFacts(data.paymentId);
    if (!payment) return type === 'charge.succeeded' ? this.chargeOfLostPayment(data) : noEffect('unknown-payment', ids);
    const mismatch = disagreement(
      [payment.order_id, data.orderId, 'orderId'],
      [Number(payment.amount_minor), data.amountMinor, 'amountMinor'],
      [payment.currency, data.currency, 'currency'],
    );
    if (mismatch) return { ...noEffect(`mismatch: ${mismatch}`, ids), alert: true };

    if (payment.status === 'pending') {
      const outcome: ProviderOutcome =
        type === 'charge.succeeded'
          ? { status: 'succeeded', providerId: data.chargeId }
          : { status: 'failed', failureCode: data.failureCode ?? 'card_declined', providerId: data.chargeId };
      // No lease token: a webhook holds no lease. It settles a payment whose request is still running
      // too, completing that request's key with the answer the request would have given.
      const settled = await this.settlement.applyPaymentOutcome(payment.id, outcome, undefined, 'webhook');
      if (settled.kind === 'answered' && settled.changed)
        return applied(type === 'charge.succeeded' ? 'payment-succeeded' : 'payment-failed', ids);
      // Settled meanwhile without this charge: the settlement recorded its refund, started once this commits.
      if (settled.kind === 'answered' && settled.lateRefundId)
        return { ...applied('late-charge: refund requested', ids), lateRefundId: settled.lateRefundId };
      // Someone else settled it first: judge the event against what they decided.
      payment = (await this.paymentFacts(data.paymentId))!;
    }
    if (type === 'charge.succeeded' && payment.status === 'failed') return this.lateCharge(payment, data, 'late-charge');
    if (type === 'charge.succeeded' && payment.provider_transaction_id !== null && payment.provider_transaction_id !== data.chargeId) {
      // A second charge for one payment (the provider did not dedupe our outbound key): the money is taken twice, so it goes back too.
      this.logger.error(
        { paymentId: payment.id, chargeId: data.chargeId, settledWith: payment.provider_transaction_id, alert: true },
        'a second charge for a succeeded payment',
      );
      return this.lateCharge(payment, data, 'second-charge');
    }
    return noEffect(`already-settled: payment is ${payment.status}`, ids);
  }

  /**
   * The provider charged a payment we hold as failed (the charge landed after we gave it up), or
   * charged a succeeded one a second time: the money goes back. The pending refund is recorded with the event, once per charge; the
   * provider
   * is called after the commit, under a key derived from the charge.
   */
  private async lateCharge(payment: PaymentFacts, data: ChargeEventData, what: 'late-charge' | 'second-charge'): Promise<Effect> {
    const lateRefundId = await this.lateRefunds.requestRefund(payment.id, data.chargeId, data.amountMinor, 'webhook');
    if (!lateRefundId) return noEffect(`${what}: its refund was already requested`, { paymentId: payment.id });
    return { ...applied(`${what}: refund requested`, { paymentId: payment.id }), lateRefundId };
  }

  /**
   * Money taken for a payment we do not have: our pending record is committed before the provider is called, so only a
   * failover that lost it explains this — when the charge is this deployment's. The charge is refunded, and its order
   * voided if it is gone too (LostPayments).
   */
  private async chargeOfLostPayment(data: ChargeEventData): Promise<Effect> {
    if (!this.lostPayments.madeHere(data.deploymentId)) {
      const detail = `unknown-payment: not this deployment's charge (metadata.deploymentId ${data.deploymentId ?? 'absent or malformed'})`;
      return noEffect(detail, { paymentId: data.paymentId });
    }
    const lateRefundId = await this.lostPayments.repair(
      { chargeId: data.chargeId, paymentId: data.paymentId, orderId: data.orderId, amountMinor: data.amountMinor, currency: data.currency },
      'webhook',
    );
    if (!lateRefundId) return noEffect('unknown-payment: its refund was already requested', { paymentId: data.paymentId });
    return { ...applied('unknown-payment: refund requested', { paymentId: data.paymentId }), lateRefundId };
  }

  private async refundEvent(type: 'refund.succeeded' | 'refund.failed', data: RefundEventData): Promise<Effect> {
    const ids = { paymentId: data.paymentId, refundId: data.refundId };
    const outcome: ProviderOutcome =
      type === 'refund.succeeded'
        ? { status: 'succeeded', providerId: data.providerRefundId }
        : { status: 'failed', failureCode: data.failureCode ?? 'refund_declined', providerId: data.providerRefundId };
    const [refund] = await this.db.query<RefundFacts>(
      `SELECT r.id, r.payment_id, p.order_id, r.status, r.amount_minor, p.currency, r.provider_refund_id FROM refunds r JOIN payments p ON p.id = r.payment_id WHERE r.id = $1`,
      [data.refundId],
    );
    if (!refund) return this.lateRefundEvent(data, outcome);
    const mismatch = disagreement(
      [refund.payment_id, data.paymentId, 'paymentId'],
      [refund.order_id, data.orderId, 'orderId'],
      [Number(refund.amount_minor), data.amountMinor, 'amountMinor'],
      [refund.currency, data.currency, 'currency'],
    );
    if (mismatch) return { ...noEffect(`mismatch: ${mismatch}`, ids), alert: true };
    if (type === 'refund.succeeded' && refund.status === 'failed') {
      // We failed it as never reached, and the provider made it after all: the books follow the money.
      const repaired = await this.settlement.applyLateRefund(refund.id, data.providerRefundId, 'webhook');
      if (repaired === 'applied') return applied('late-refund: applied', ids);
      // Applied first by the sweep or a settler: nothing left to do, nothing to alert about.
      if (repaired === 'already-applied') return noEffect('already-settled: late refund applied', ids);
      return { ...noEffect('late-refund: our reservations leave no room for it', ids), alert: true };
    }
    // A second provider refund for a refund already succeeded: alerted (and counted) by the settlement, as a second charge is.
    if (type === 'refund.succeeded' && this.settlement.alertIfSecondRefund(refund, data.providerRefundId, 'webhook'))
      return noEffect('second-refund: alerted', ids);
    if (refund.status !== 'pending') return noEffect(`already-settled: refund is ${refund.status}`, ids);
    const settled = await this.settlement.applyRefundOutcome(refund.id, outcome, undefined, 'webhook');
    if (settled.kind === 'answered' && settled.changed)
      return applied(type === 'refund.succeeded' ? 'refund-succeeded' : 'refund-failed', ids);
    return noEffect('already-settled: refund settled meanwhile', ids);
  }

  /** A refund event about the refund of a late charge (its metadata.refundId is that row's id). */
  private async lateRefundEvent(data: RefundEventData, outcome: ProviderOutcome): Promise<Effect> {
    const [late] = await this.db.query<{ id: string; payment_id: string; charge_id: string; amount_minor: string }>(
      `SELECT id, coalesce(payment_id, lost_payment_id) AS payment_id, charge_id, amount_minor FROM late_charge_refunds WHERE id = $1`,
      [data.refundId],
    );
    if (!late) {
      // Money given back that our books do not know (its refund lost in a failover, or made by hand at the provider): the
      // payment still counts it as taken. Only a person can tell which.
      this.paymentMetrics.lateLandings.inc({ kind: 'unknown_refund', found_by: 'webhook' });
      return { ...noEffect('unknown-refund', { paymentId: data.paymentId }), alert: true };
    }
    const mismatch = disagreement(
      [late.payment_id, data.paymentId, 'paymentId'],
      [late.charge_id, data.chargeId, 'chargeId'],
      [Number(late.amount_minor), data.amountMinor, 'amountMinor'],
    );
    if (mismatch) return { ...noEffect(`mismatch: ${mismatch}`, { paymentId: data.paymentId }), alert: true };
    const changed = await this.lateRefunds.settle(
      late.id,
      outcome.status,
      outcome.providerId ?? null,
      outcome.status === 'failed' ? outcome.failureCode : null,
    );
    return changed
      ? applied(`late-charge-refund-${outcome.status}`, { paymentId: late.payment_id })
      : noEffect('already-settled: late-charge refund', { paymentId: late.payment_id });
  }

  private async paymentFacts(paymentId: string): Promise<PaymentFacts | undefined> {
    const [row] = await this.db.query<PaymentFacts>(
      `SELECT id, order_id, status, amount_minor, currency, provider_transaction_id FROM payments WHERE id = $1`,
      [paymentId],
    );
    return row;
  }
}

/** "amountMinor 2400 ≠ ours 2500"-style text for the fields where the event and our row differ; undefined when they agree. */
function disagreement(...pairs: [ours: string | number, theirs: string | number, field: string][]): string | undefined {
  const differing = pairs.filter(([ours, theirs]) => ours !== theirs).map(([ours, theirs, field]) => `${field} ${theirs} ≠ ours ${ours}`);
  return differing.length ? differing.join(', ') : undefined;
}
