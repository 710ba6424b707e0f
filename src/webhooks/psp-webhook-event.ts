/**
 * The provider's events (docs/contract.md#webhooks): `{type, timestamp, data}`; paymentId and refundId are ours, from the metadata we sent.
 */
export interface ChargeEventData {
  chargeId: string;
  paymentId: string;
  orderId: string;
  /** The charge's metadata.deploymentId: which deployment made it; absent when made without one. */
  deploymentId?: string;
  amountMinor: number;
  currency: string;
  status: 'succeeded' | 'failed';
  failureCode: string | null;
}

export interface RefundEventData extends ChargeEventData {
  providerRefundId: string;
  refundId: string;
}

export type PspWebhookEvent =
  | { kind: 'charge'; type: 'charge.succeeded' | 'charge.failed'; data: ChargeEventData }
  | { kind: 'refund'; type: 'refund.succeeded' | 'refund.failed'; data: RefundEventData }
  /** Well-formed, but of a type this consumer does not act on. */
  | { kind: 'unknown-type'; type: string }
  /** Signed by the provider but unreadable: it will never become readable, so it is acknowledged (and alerted on). */
  | { kind: 'malformed'; type: string | null; why: string };

export const CHARGE_EVENT_TYPES = ['charge.succeeded', 'charge.failed'] as const;
export const REFUND_EVENT_TYPES = ['refund.succeeded', 'refund.failed'] as const;

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
/** What the provider accepts as metadata.deploymentId (docs/contract.md#sandbox-provider). */
const DEPLOYMENT_ID = /^[\x21-\x7e]{1,64}$/;
/** Provider ids are short tokens (ch_…, re_…); the bound keeps a bogus one out of unique indexes. */
const MAX_PROVIDER_ID = 255;

type Fields = Record<string, unknown>;
const isObject = (v: unknown): v is Fields => typeof v === 'object' && v !== null && !Array.isArray(v);
const providerId = (v: unknown): v is string => typeof v === 'string' && v.length > 0 && v.length <= MAX_PROVIDER_ID;
const uuid = (v: unknown): v is string => typeof v === 'string' && UUID.test(v);

/** Why the charge fields are not what the provider sends, or undefined when they are. */
function chargeDefect(d: Fields, expectedStatus: string): string | undefined {
  if (!providerId(d.chargeId)) return 'data.chargeId is missing or not a provider id';
  if (!uuid(d.paymentId)) return 'data.paymentId is not a UUID';
  if (!uuid(d.orderId)) return 'data.orderId is not a UUID';
  if (!Number.isSafeInteger(d.amountMinor) || (d.amountMinor as number) < 1) return 'data.amountMinor is not a positive integer';
  if (typeof d.currency !== 'string' || !/^[A-Z]{3}$/.test(d.currency)) return 'data.currency is not an ISO 4217 code';
  if (d.status !== expectedStatus) return `data.status is not ${expectedStatus}`;
  if (d.failureCode !== undefined && d.failureCode !== null && typeof d.failureCode !== 'string') return 'data.failureCode is not a string';
  return undefined;
}

function chargeData(d: Fields): ChargeEventData {
  return {
    chargeId: d.chargeId as string,
    paymentId: (d.paymentId as string).toLowerCase(),
    orderId: (d.orderId as string).toLowerCase(),
    // Kept only in the shape ours has (visible ASCII): anything else is another's, and must not reach a log or a row as given.
    ...(typeof d.deploymentId === 'string' && DEPLOYMENT_ID.test(d.deploymentId) ? { deploymentId: d.deploymentId } : {}),
    amountMinor: d.amountMinor as number,
    currency: d.currency as string,
    status: d.status as ChargeEventData['status'],
    failureCode: typeof d.failureCode === 'string' ? d.failureCode : null,
  };
}

/** Reads a verified body. Never throws: whatever the provider signed gets an answer. */
export function parsePspWebhookEvent(raw: Buffer): PspWebhookEvent {
  let body: unknown;
  try {
    body = JSON.parse(raw.toString('utf8'));
  } catch {
    return { kind: 'malformed', type: null, why: 'the body is not JSON' };
  }
  if (!isObject(body) || typeof body.type !== 'string') return { kind: 'malformed', type: null, why: 'the body has no type' };
  const type = body.type;
  const isCharge = (CHARGE_EVENT_TYPES as readonly string[]).includes(type);
  const isRefund = (REFUND_EVENT_TYPES as readonly string[]).includes(type);
  if (!isCharge && !isRefund) return { kind: 'unknown-type', type };
  if (!isObject(body.data)) return { kind: 'malformed', type, why: 'data is not an object' };
  const d = body.data;
  const expectedStatus = type.endsWith('.succeeded') ? 'succeeded' : 'failed';
  const defect = chargeDefect(d, expectedStatus);
  if (defect) return { kind: 'malformed', type, why: defect };
  if (isCharge) return { kind: 'charge', type: type as 'charge.succeeded' | 'charge.failed', data: chargeData(d) };
  if (!providerId(d.providerRefundId)) return { kind: 'malformed', type, why: 'data.providerRefundId is missing or not a provider id' };
  if (!uuid(d.refundId)) return { kind: 'malformed', type, why: 'data.refundId is not a UUID' };
  return {
    kind: 'refund',
    type: type as 'refund.succeeded' | 'refund.failed',
    data: { ...chargeData(d), providerRefundId: d.providerRefundId, refundId: d.refundId.toLowerCase() },
  };
}
