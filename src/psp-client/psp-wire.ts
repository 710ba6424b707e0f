/** The provider's HTTP shapes (docs/contract.md#sandbox-provider: the sandbox serves exactly these). */

export interface PspCharge {
  id: string; // "ch_" + random
  status: 'succeeded' | 'failed';
  amountMinor: number;
  currency: string;
  source: string;
  failureCode: string | null; // "card_declined" when failed
  // deploymentId: only when the charge was made with one. Not checked: it is only ever compared with ours, so another's
  // charge with an odd one is simply not ours (and does not make its whole listing page unreadable).
  metadata: { orderId: string; paymentId: string; deploymentId?: unknown };
  createdAt: string; // ISO 8601
}

export interface PspRefund {
  id: string; // "re_" + random
  status: 'succeeded' | 'failed';
  chargeId: string;
  amountMinor: number;
  failureCode: string | null;
  metadata: { refundId: string; paymentId: string };
  createdAt: string;
}

export interface ChargeRequest {
  amountMinor: number;
  currency: string;
  source: string;
  metadata: { orderId: string; paymentId: string; deploymentId: string };
}

export interface RefundRequest {
  chargeId: string;
  amountMinor: number;
  metadata: { refundId: string; paymentId: string };
}

type Fields = Record<string, unknown>;

const isObject = (v: unknown): v is Fields => typeof v === 'object' && v !== null && !Array.isArray(v);
const isString = (v: unknown): v is string => typeof v === 'string';

/** What both records share; the payments module stores these fields, so they must be what they claim. */
function isRecordBase(v: unknown): v is Fields {
  return (
    isObject(v) &&
    isString(v.id) &&
    (v.status === 'succeeded' || v.status === 'failed') &&
    Number.isSafeInteger(v.amountMinor) &&
    (v.failureCode === null || isString(v.failureCode)) &&
    isString(v.createdAt) &&
    isObject(v.metadata) &&
    isString(v.metadata.paymentId)
  );
}

export function isPspCharge(v: unknown): v is PspCharge {
  if (!isRecordBase(v)) return false;
  const metadata = v.metadata as Fields;
  return isString(v.currency) && isString(v.source) && isString(metadata.orderId);
}

export function isPspRefund(v: unknown): v is PspRefund {
  return isRecordBase(v) && isString(v.chargeId) && isString((v.metadata as Fields).refundId);
}

/** A refusal's explanation: problem+json `detail`, else its `title`, else the status. */
export function problemDetail(status: number, body: unknown): string {
  if (isObject(body)) {
    if (isString(body.detail) && body.detail) return body.detail;
    if (isString(body.title) && body.title) return body.title;
  }
  return `The provider refused the request (HTTP ${status}).`;
}
