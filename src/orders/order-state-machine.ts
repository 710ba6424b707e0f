import { ORDER_STATUSES, type OrderStatus } from './order-status.js';

/**
 * The order lifecycle (docs/contract.md#orders): every status and the statuses it may move to. delivered and
 * refunded are final. The SQL that moves an order asks this table, never its own copy of it.
 */
const ORDER_TRANSITIONS: Readonly<Record<OrderStatus, readonly OrderStatus[]>> = {
  created: ['paid', 'cancelled'],
  paid: ['shipped', 'cancelled'],
  shipped: ['delivered'],
  cancelled: ['refunded'],
  delivered: [],
  refunded: [],
};

/** Where an order in `status` may go next. */
export function nextStatuses(status: OrderStatus): readonly OrderStatus[] {
  return ORDER_TRANSITIONS[status];
}

export function canTransition(from: OrderStatus, to: OrderStatus): boolean {
  return ORDER_TRANSITIONS[from].includes(to);
}

/** The statuses an order may reach `target` from: the `status = ANY(…)` of the conditional UPDATE. */
export function allowedFrom(target: OrderStatus): OrderStatus[] {
  return ORDER_STATUSES.filter((from) => canTransition(from, target));
}
