import { randomBytes, randomInt } from 'node:crypto';
import type { SandboxClient } from './sandbox-database.js';

export type WebhookEventType = 'charge.succeeded' | 'charge.failed' | 'refund.succeeded' | 'refund.failed';

/** `data` of a charge event (docs/contract.md#webhooks): paymentId, orderId and deploymentId are the metadata the service sent. */
export interface ChargeEventData {
  chargeId: string;
  paymentId: string;
  orderId: string;
  /** Only when the charge was made with one. */
  deploymentId?: string;
  amountMinor: number;
  currency: string;
  status: 'succeeded' | 'failed';
  failureCode?: string;
}

/** `data` of a refund event: refundId and paymentId are the service's, providerRefundId is ours ("re_…"). */
export interface RefundEventData {
  providerRefundId: string;
  refundId: string;
  chargeId: string;
  paymentId: string;
  orderId: string;
  amountMinor: number;
  currency: string;
  status: 'succeeded' | 'failed';
  failureCode?: string;
}

/**
 * In duplicates mode each copy is due at a random moment within this window: both copies of an
 * event arrive within a second, and the events of one second arrive in no particular order.
 */
export const DUPLICATE_SPREAD_MS = 1_000;

/** Notified in the outbox row's transaction: the relays (webhook-relay.ts) LISTEN on it. */
export const OUTBOX_CHANNEL = 'psp_webhook_outbox';

/** Standard Webhooks' suggested `msg_` prefix + 96 random bits: the webhook-id of every copy and attempt. */
const newEventId = () => `msg_${randomBytes(12).toString('hex')}`;

/**
 * Queues one event in the outbox ON `client`, i.e. inside the caller's transaction: the event
 * commits with the charge or refund it reports, or not at all. With `duplicates`, a second copy
 * (same id) is queued as its own durable row, so the duplicate survives a restart exactly as the
 * first copy does.
 */
export async function enqueueWebhookEvent(
  client: SandboxClient,
  type: WebhookEventType,
  data: ChargeEventData | RefundEventData,
  duplicates: boolean,
): Promise<string> {
  const id = newEventId();
  const copies = duplicates ? [1, 2] : [1];
  for (const copy of copies) {
    const delayMs = duplicates ? randomInt(DUPLICATE_SPREAD_MS) : 0;
    await client.query(
      `INSERT INTO psp.webhook_outbox (id, copy, type, payload, next_attempt_at)
       VALUES ($1, $2, $3, $4::jsonb, now() + $5::int * interval '1 millisecond')`,
      [id, copy, type, JSON.stringify(data), delayMs],
    );
  }
  // Delivered to the listening relays at COMMIT, and never for a rollback: they wake to a row they can see.
  await client.query('SELECT pg_notify($1, $2)', [OUTBOX_CHANNEL, '']);
  return id;
}
