import { Injectable } from '@nestjs/common';
import { randomBytes } from 'node:crypto';
import { isUUID } from 'class-validator';
import { ProblemException } from '../common/problem.js';
import { Database } from '../database/database.service.js';
import type { CreateOrderDto, OrderItemDto } from './dto/create-order.dto.js';
import { DEFAULT_PAGE_SIZE, type ListOrdersQuery } from './dto/list-orders.query.js';
import type { OrderPage, OrderView } from './dto/order.view.js';
import { decodeCursor, encodeCursor } from './order-cursor.js';

interface OrderRow {
  id: string;
  order_number: string;
  status: OrderView['status'];
  currency: string;
  total_minor: string;
  shipping_address: OrderView['shippingAddress'];
  note: string | null;
  version: number;
  created_at: Date;
  updated_at: Date;
  items: OrderItemDto[];
  created_at_key?: string;
}

export interface CreatedOrder {
  order: OrderView;
  /** False when the order number already existed with the same content: the existing order is returned. */
  created: boolean;
}

/** Columns of an order with its items, in line order: one round trip for a read. */
const ORDER_COLUMNS = `
  o.id, o.order_number, o.status, o.currency, o.total_minor, o.shipping_address, o.note, o.version,
  o.created_at, o.updated_at,
  (SELECT coalesce(json_agg(json_build_object('sku', i.sku, 'quantity', i.quantity, 'unitPriceMinor', i.unit_price_minor) ORDER BY i.line_no), '[]')
     FROM order_items i WHERE i.order_id = o.id) AS items`;

/**
 * Inserts the order and its lines in one statement. ON CONFLICT on the natural key makes a
 * concurrent duplicate wait for the first insert's transaction and then insert nothing: the
 * database, not a prior SELECT, decides which request created the order.
 */
const INSERT_ORDER = `
  WITH o AS (
    INSERT INTO orders (client_id, order_number, currency, total_minor, shipping_address, note)
    VALUES ($1, $2, $3, $4, $5, $6)
    ON CONFLICT ON CONSTRAINT uq_orders_client_order_number DO NOTHING
    RETURNING *
  ), lines AS (
    INSERT INTO order_items (order_id, line_no, sku, quantity, unit_price_minor)
    SELECT o.id, l.line_no, l.sku, l.quantity, l.unit_price_minor
      FROM o, unnest($7::text[], $8::int[], $9::bigint[]) WITH ORDINALITY AS l(sku, quantity, unit_price_minor, line_no)
  )
  SELECT o.*, $10::json AS items FROM o`;

function toView(row: OrderRow): OrderView {
  return {
    id: row.id,
    orderNumber: row.order_number,
    status: row.status,
    currency: row.currency,
    totalMinor: Number(row.total_minor),
    items: row.items,
    shippingAddress: row.shipping_address,
    note: row.note,
    version: row.version,
    createdAt: row.created_at.toISOString(),
    updatedAt: row.updated_at.toISOString(),
  };
}

/** 96 random bits: a collision with another generated number is not a practical concern, and is retried if it happens. */
function generateOrderNumber(): string {
  return `ord_${randomBytes(12).toString('base64url')}`;
}

function sameContent(dto: CreateOrderDto, items: OrderItemDto[], existing: OrderView): boolean {
  const content = (o: { currency: string; items: OrderItemDto[]; shippingAddress?: unknown; note?: string | null }) =>
    JSON.stringify([
      o.currency,
      o.items.map((i) => [i.sku, i.quantity, i.unitPriceMinor]),
      canonicalAddress(o.shippingAddress),
      o.note ?? null,
    ]);
  return content({ ...dto, items }) === content(existing);
}

function canonicalAddress(address: unknown): unknown {
  if (!address || typeof address !== 'object') return null;
  return Object.fromEntries(Object.entries(address).filter(([, v]) => v !== undefined).sort(([a], [b]) => a.localeCompare(b)));
}

@Injectable()
export class OrdersService {
  constructor(private readonly db: Database) {}

  async createOrder(clientId: string, dto: CreateOrderDto): Promise<CreatedOrder> {
    // Plain copies: what is stored and compared is exactly the validated fields.
    const items = dto.items.map(({ sku, quantity, unitPriceMinor }) => ({ sku, quantity, unitPriceMinor }));
    const total = items.reduce((sum, i) => sum + i.quantity * i.unitPriceMinor, 0);
    const address = dto.shippingAddress ? canonicalAddress(dto.shippingAddress) : null;
    const generated = dto.orderNumber === undefined;
    for (let attempt = 0; ; attempt++) {
      const orderNumber = dto.orderNumber ?? generateOrderNumber();
      const [row] = await this.db.query<OrderRow>(INSERT_ORDER, [
        clientId,
        orderNumber,
        dto.currency,
        total,
        address,
        dto.note ?? null,
        items.map((i) => i.sku),
        items.map((i) => i.quantity),
        items.map((i) => i.unitPriceMinor),
        JSON.stringify(items),
      ]);
      if (row) return { order: toView(row), created: true };
      if (generated && attempt < 2) continue;
      const existing = await this.findByNumber(clientId, orderNumber);
      if (existing && sameContent(dto, items, existing)) return { order: existing, created: false };
      throw ProblemException.of(
        409,
        'order-number-conflict',
        'Order number already used',
        `Order number ${orderNumber} already belongs to an order with different content.`,
        existing ? { orderId: existing.id } : {},
      );
    }
  }

  async findOrder(clientId: string, id: string): Promise<OrderView> {
    // Another client's order, or an id that cannot exist, is simply not found: no hint that it exists.
    const [row] = isUUID(id)
      ? await this.db.query<OrderRow>(`SELECT ${ORDER_COLUMNS} FROM orders o WHERE o.id = $1 AND o.client_id = $2`, [id, clientId])
      : [];
    if (!row) throw ProblemException.of(404, 'order-not-found', 'Order not found', `There is no order ${id}.`);
    return toView(row);
  }

  private async findByNumber(clientId: string, orderNumber: string): Promise<OrderView | undefined> {
    const [row] = await this.db.query<OrderRow>(
      `SELECT ${ORDER_COLUMNS} FROM orders o WHERE o.client_id = $1 AND o.order_number = $2`,
      [clientId, orderNumber],
    );
    return row && toView(row);
  }

  /** Keyset pagination, newest first: stable under concurrent inserts, and as fast on page 1000 as on page 1. */
  async listOrders(clientId: string, query: ListOrdersQuery): Promise<OrderPage> {
    const limit = query.limit ?? DEFAULT_PAGE_SIZE;
    const params: unknown[] = [clientId, limit + 1];
    let where = 'o.client_id = $1';
    if (query.status) {
      params.push(query.status);
      where += ` AND o.status = $${params.length}`;
    }
    if (query.cursor !== undefined) {
      const after = decodeCursor(query.cursor);
      params.push(after.createdAt, after.id);
      where += ` AND (o.created_at, o.id) < ($${params.length - 1}::timestamptz, $${params.length}::uuid)`;
    }
    const rows = await this.db.query<OrderRow>(
      `SELECT ${ORDER_COLUMNS}, o.created_at::text AS created_at_key FROM orders o
        WHERE ${where} ORDER BY o.created_at DESC, o.id DESC LIMIT $2`,
      params,
    );
    const page = rows.slice(0, limit);
    const last = page[page.length - 1];
    return {
      items: page.map(toView),
      nextCursor: rows.length > limit && last ? encodeCursor({ createdAt: last.created_at_key!, id: last.id }) : null,
    };
  }
}
