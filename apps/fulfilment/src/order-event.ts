/**
 * An order event as the order service publishes it (docs/patterns/message-consumer.md#the-message-contract):
 * JSON, camelCase, `messageId` = `eventId`, `type` = the routing key. Checked whole before anything is written:
 * a message that is not one of these is a failure (retried, then dead-lettered), never half-applied.
 */
export const ORDER_EVENT_TYPES = ['order.created', 'order.paid', 'order.cancelled', 'order.refunded', 'order.voided'] as const;
export type OrderEventType = (typeof ORDER_EVENT_TYPES)[number];

export interface OrderEvent {
  eventId: string;
  type: OrderEventType;
  orderId: string;
  clientId: string;
  orderVersion: number;
  totalMinor: number;
  currency: string;
  occurredAt: string;
}

export class MalformedOrderEvent extends Error {}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export function parseOrderEvent(data: unknown): OrderEvent {
  if (typeof data !== 'object' || data === null || Array.isArray(data)) throw new MalformedOrderEvent('the body is not a JSON object');
  const e = data as Record<string, unknown>;
  const wrong: string[] = [];
  if (typeof e.eventId !== 'string' || !UUID.test(e.eventId)) wrong.push('eventId (a UUID)');
  if (!ORDER_EVENT_TYPES.includes(e.type as OrderEventType)) wrong.push(`type (one of ${ORDER_EVENT_TYPES.join(', ')})`);
  if (typeof e.orderId !== 'string' || !UUID.test(e.orderId)) wrong.push('orderId (a UUID)');
  if (typeof e.clientId !== 'string' || e.clientId.length === 0 || e.clientId.length > 200) wrong.push('clientId');
  if (!Number.isSafeInteger(e.orderVersion) || (e.orderVersion as number) < 1 || (e.orderVersion as number) > 2 ** 31 - 1)
    wrong.push('orderVersion (an integer ≥ 1)');
  if (!Number.isSafeInteger(e.totalMinor) || (e.totalMinor as number) < 0) wrong.push('totalMinor (integer minor units ≥ 0)');
  if (typeof e.currency !== 'string' || !/^[A-Z]{3}$/.test(e.currency)) wrong.push('currency (ISO 4217)');
  if (typeof e.occurredAt !== 'string' || Number.isNaN(Date.parse(e.occurredAt))) wrong.push('occurredAt (ISO 8601)');
  if (wrong.length) throw new MalformedOrderEvent(`not an order event: ${wrong.join(', ')}`);
  return e as unknown as OrderEvent;
}
