import { Injectable } from '@nestjs/common';
import { Database } from '@idempotent-orders/idempotency';
import type { OrderEvent } from './order-event.js';

export interface Shipment {
  orderId: string;
  clientId: string;
  status: 'pending' | 'cancelled';
  totalMinor: number;
  currency: string;
  orderVersion: number;
  createdAt: string;
  updatedAt: string;
}

/**
 * The effect: one shipment per paid order, cancelled when the order is cancelled, refunded or voided. Each event is
 * one upsert on the business key (the order id) guarded by the order's version: an event older than the last one
 * applied changes nothing, whatever order the broker delivers them in. Written through `Database`, so it commits
 * with the message's dedupe mark.
 */
@Injectable()
export class ShipmentsService {
  constructor(private readonly db: Database) {}

  /** True when the event changed the shipment; false when it was older than what is applied, or has no effect. */
  async apply(event: OrderEvent): Promise<boolean> {
    if (event.type === 'order.created') return false;
    const status = event.type === 'order.paid' ? 'pending' : 'cancelled';
    // A cancelled shipment stays cancelled: cancelled and refunded orders are final in the order's state machine.
    // order.voided (the order no longer exists) cancels whatever the version; with no shipment yet it writes a
    // cancelled one, which a late order.paid then cannot turn pending.
    const rows = await this.db.query(
      `INSERT INTO fulfilment.shipments AS s (order_id, client_id, status, total_minor, currency, order_version)
       VALUES ($1, $2, $3, $4, $5, $6)
       ON CONFLICT (order_id) DO UPDATE
         SET status = EXCLUDED.status, total_minor = EXCLUDED.total_minor, currency = EXCLUDED.currency,
             order_version = GREATEST(s.order_version, EXCLUDED.order_version), updated_at = now()
         WHERE (s.order_version < EXCLUDED.order_version OR $7) AND s.status <> 'cancelled'
       RETURNING 1`,
      [event.orderId, event.clientId, status, event.totalMinor, event.currency, event.orderVersion, event.type === 'order.voided'],
    );
    return rows.length > 0;
  }

  async find(orderId: string): Promise<Shipment | undefined> {
    const [row] = await this.db.query<Shipment>(
      `SELECT order_id AS "orderId", client_id AS "clientId", status, total_minor::float8 AS "totalMinor", currency,
              order_version AS "orderVersion", created_at AS "createdAt", updated_at AS "updatedAt"
         FROM fulfilment.shipments WHERE order_id = $1`,
      [orderId],
    );
    return row;
  }
}
