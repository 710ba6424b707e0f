export const ORDER_STATUSES = ['created', 'paid', 'cancelled', 'shipped', 'delivered', 'refunded'] as const;
export type OrderStatus = (typeof ORDER_STATUSES)[number];
