/**
 * The order events of the message contract (docs/patterns/transactional-outbox.md): written to order_events_outbox
 * by the statement that makes the change, published by the relay (order-events-relay.ts).
 */
export const ORDER_EVENT_TYPES = ['order.created', 'order.paid', 'order.cancelled', 'order.refunded'] as const;
/**
 * Not a status the order reaches: the order is gone from our books (a failover lost it after its events went out), so
 * a consumer undoes what it did for it. Its version is the largest: the order id never comes back, so nothing follows.
 */
export const ORDER_VOIDED = 'order.voided';
export const ORDER_VOIDED_VERSION = 2 ** 31 - 1;
export type OrderEventType = (typeof ORDER_EVENT_TYPES)[number] | typeof ORDER_VOIDED;

/** The topic exchange the relay publishes to; the routing key is the event type. */
export const ORDER_EVENTS_EXCHANGE = 'orders.events';
/** The message body, as stored in the outbox's payload and published unchanged. */
export interface OrderEventMessage {
  eventId: string;
  type: OrderEventType;
  orderId: string;
  clientId: string;
  /** The order's version after the change: it orders the events of one order. */
  orderVersion: number;
  totalMinor: number;
  currency: string;
  /** ISO-8601, UTC, milliseconds. */
  occurredAt: string;
}

/** The statuses whose arrival is an event (`order.<status>`); shipped and delivered are not in the contract. */
const STATUSES_WITH_EVENTS = ORDER_EVENT_TYPES.map((type) => `'${type.slice('order.'.length)}'`).join(', ');

/**
 * The body of a CTE that inserts the event of each row of `source` (an earlier CTE of the same statement returning
 * the order's id, status, version, currency and total_minor after the change): the event commits with the change
 * or not at all, in the change's own round trip. `clientId` is the SQL for the order's client (a parameter);
 * `occurredAt` an expression over `s` or a clock. Event id and time are taken per row (a target list's volatile
 * functions are evaluated per row).
 */
export function insertOrderEvents(source: string, clientId: string, occurredAt: string): string {
  return `
    INSERT INTO order_events_outbox (event_id, type, order_id, client_id, order_version, payload, created_at)
    SELECT e.event_id, e.type, e.id, ${clientId}, e.version,
           jsonb_build_object(
             'eventId', e.event_id, 'type', e.type, 'orderId', e.id, 'clientId', ${clientId}, 'orderVersion', e.version,
             'totalMinor', e.total_minor, 'currency', e.currency,
             'occurredAt', to_char(e.occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')),
           e.occurred_at
      FROM (SELECT s.id, s.version, s.total_minor, s.currency, 'order.' || s.status AS type,
                   gen_random_uuid() AS event_id, ${occurredAt} AS occurred_at
              FROM ${source} s WHERE s.status IN (${STATUSES_WITH_EVENTS})) e`;
}

/**
 * One statement: the `order.voided` event of order $1 when no such order exists (its client is not known any more:
 * '(unknown)'), at most once per order (uq_order_events_outbox_order_version). $2 total_minor and $3 currency: what the
 * provider charged for it. Returns the event id when it was written.
 */
export const INSERT_ORDER_VOIDED_IF_MISSING = `
  INSERT INTO order_events_outbox (event_id, type, order_id, client_id, order_version, payload, created_at)
  SELECT e.event_id, '${ORDER_VOIDED}', $1::uuid, '(unknown)', ${ORDER_VOIDED_VERSION},
         jsonb_build_object(
           'eventId', e.event_id, 'type', '${ORDER_VOIDED}', 'orderId', $1::uuid, 'clientId', '(unknown)',
           'orderVersion', ${ORDER_VOIDED_VERSION}, 'totalMinor', $2::bigint, 'currency', $3::text,
           'occurredAt', to_char(e.occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')),
         e.occurred_at
    FROM (SELECT gen_random_uuid() AS event_id, clock_timestamp() AS occurred_at) e
   WHERE NOT EXISTS (SELECT 1 FROM orders WHERE id = $1::uuid)
  ON CONFLICT (order_id, order_version) DO NOTHING
  RETURNING event_id`;
