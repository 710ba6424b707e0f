import { Injectable } from '@nestjs/common';
import { createHash, randomBytes } from 'node:crypto';
import { isUUID } from 'class-validator';
import { Database } from '@idempotent-orders/idempotency';
import { canonicalJson, ProblemException } from '#service-kit';
import type { CreateOrderDto, OrderItemDto } from './dto/create-order.dto.js';
import { DEFAULT_PAGE_SIZE, type ListOrdersQuery } from './dto/list-orders.query.js';
import type { OrderPage, OrderView } from './dto/order.view.js';
import type { OrderEventView } from './dto/order-event.view.js';
import type { UpdateOrderDto } from './dto/update-order.dto.js';
import { insertOrderEvents } from '../events/order-events-outbox.js';
import { paymentInProgress } from '../common/payment-in-progress.js';
import { versionEtag } from './if-match.js';
import { decodeCursor, encodeCursor } from './order-cursor.js';
import { ORDER_TABLE_COLUMNS } from './order-columns.js';
import { allowedFrom, nextStatuses } from './order-state-machine.js';
import type { OrderStatus } from './order-status.js';

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
  creation_digest?: string | null;
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
 * Inserts the order, its lines and its order.created event in one statement. ON CONFLICT on the natural key makes a
 * concurrent duplicate wait for the first insert's transaction and then insert nothing (no order, no event): the
 * database, not a prior SELECT, decides which request created the order. Without the event only for
 * `npm run bench:create-sql`, which measures what the outbox row costs a create.
 */
export function insertOrderStatement(withCreatedEvent = true): string {
  const createdEvent = withCreatedEvent
    ? `, created_event AS (${insertOrderEvents('o', '$1::text', 's.created_at')}
  )`
    : '';
  return `
  WITH o AS (
    INSERT INTO orders (client_id, order_number, currency, total_minor, shipping_address, note, creation_digest)
    VALUES ($1, $2, $3, $4, $5, $6, $11)
    ON CONFLICT ON CONSTRAINT uq_orders_client_order_number DO NOTHING
    RETURNING ${ORDER_TABLE_COLUMNS}
  ), lines AS (
    INSERT INTO order_items (order_id, line_no, sku, quantity, unit_price_minor)
    SELECT o.id, l.line_no, l.sku, l.quantity, l.unit_price_minor
      FROM o, unnest($7::text[], $8::int[], $9::bigint[]) WITH ORDINALITY AS l(sku, quantity, unit_price_minor, line_no)
  )${createdEvent}
  SELECT ${ORDER_TABLE_COLUMNS}, $10::json AS items FROM o`;
}
const INSERT_ORDER = insertOrderStatement();

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

const ORDER_NUMBER_BYTES = 12;
/** Random bytes for this many order numbers are drawn at once: one randomBytes(12) per create was a getrandom system
 * call each, 2-4 % of a create's JavaScript in a profile; Node's randomUUID keeps a pool the same way. */
const ORDER_NUMBERS_PER_DRAW = 256;
let randomPool = Buffer.alloc(0);
let randomOffset = 0;

/** 96 random bits: a collision with another generated number is not a practical concern, and is retried if it happens. */
function generateOrderNumber(): string {
  if (randomOffset + ORDER_NUMBER_BYTES > randomPool.length) {
    randomPool = randomBytes(ORDER_NUMBER_BYTES * ORDER_NUMBERS_PER_DRAW);
    randomOffset = 0;
  }
  randomOffset += ORDER_NUMBER_BYTES;
  return `ord_${randomPool.toString('base64url', randomOffset - ORDER_NUMBER_BYTES, randomOffset)}`;
}

/** What a create says about its order: everything in the body but the order number. */
interface CreationContent {
  currency: string;
  items: readonly OrderItemDto[];
  shippingAddress?: object | null;
  note?: string | null;
}

/**
 * SHA-256 (hex) of a create's content in canonical JSON, stored with the order: a repeated create
 * is the same create exactly when its digest is equal, however the order was edited since. Items
 * keep their order (line order is part of the order); an absent address or note counts as null.
 */
export function creationDigest(content: CreationContent): string {
  const canonical = canonicalJson({
    currency: content.currency,
    items: content.items.map(({ sku, quantity, unitPriceMinor }) => ({ sku, quantity, unitPriceMinor })),
    shippingAddress: content.shippingAddress ?? null,
    note: content.note ?? null,
  });
  return createHash('sha256').update(canonical).digest('hex');
}

/** The moves clients make through the API; paid and refunded follow payments. */
export type ClientTransition = Extract<OrderStatus, 'cancelled' | 'shipped' | 'delivered'>;

/** The address and note may change until the parcel leaves, and not on a cancelled order. */
export const EDITABLE_STATUSES: readonly OrderStatus[] = ['created', 'paid'];

export interface TransitionResult {
  order: OrderView;
  /** False when the order already was in the target status: nothing was written. */
  changed: boolean;
}

interface OrderEventRow {
  id: string | null;
  order_id: string;
  from_status: OrderStatus;
  to_status: OrderStatus;
  created_at: Date;
}

/**
 * Moves an order to $3 when its status is one of $4 and records the move: one statement, so
 * the history row and the outbox's event (order.paid, .cancelled, .refunded) exist exactly when
 * the status changed. The UPDATE's WHERE decides.
 * `locked` only supplies the status being replaced: FOR UPDATE waits for a concurrent move and
 * returns the newest row, the one the UPDATE then changes; a plain self-join would report the
 * status in the statement's older snapshot (RETURNING OLD.status needs PostgreSQL 18).
 * clock_timestamp(), taken under the row lock, orders the history as the moves committed;
 * now() is the transaction's start, which can precede the previous move's.
 */
export const TRANSITION_ORDER = `
  WITH locked AS MATERIALIZED (
    SELECT id, status FROM orders WHERE id = $1 AND client_id = $2 AND status = ANY($4::text[]) FOR UPDATE
  ), updated AS (
    UPDATE orders o SET status = $3, version = o.version + 1, updated_at = now()
      FROM locked
     WHERE o.id = $1 AND o.client_id = $2 AND o.status = ANY($4::text[]) AND o.id = locked.id
    RETURNING ${ORDER_COLUMNS}, locked.status AS from_status
  ), event AS (
    INSERT INTO order_events (order_id, from_status, to_status, created_at)
    SELECT id, from_status, status, clock_timestamp() FROM updated
  ), outbox AS (${insertOrderEvents('updated', '$2::text', 'clock_timestamp()')}
  )
  SELECT * FROM updated`;

/**
 * The optimistic lock: changes the details only at a version the client read ($3) and while the
 * order is editable ($8); no row back means nothing changed. $4/$6 say whether a field was sent,
 * so an absent field is kept and note can be set to null. (The outer SELECT makes the driver
 * return rows, as for any read.)
 */
const UPDATE_ORDER_DETAILS = `
  WITH updated AS (
    UPDATE orders o SET
      shipping_address = CASE WHEN $4::boolean THEN $5::jsonb ELSE o.shipping_address END,
      note = CASE WHEN $6::boolean THEN $7::text ELSE o.note END,
      version = o.version + 1,
      updated_at = now()
     WHERE o.id = $1 AND o.client_id = $2 AND o.version = ANY($3::int[]) AND o.status = ANY($8::text[])
    RETURNING ${ORDER_COLUMNS}
  )
  SELECT * FROM updated`;

/** The LEFT JOIN keeps one row for an order without history, so "no rows" means no such order. */
const LIST_ORDER_EVENTS = `
  SELECT e.id, e.order_id, e.from_status, e.to_status, e.created_at
    FROM orders o LEFT JOIN order_events e ON e.order_id = o.id
   WHERE o.id = $1 AND o.client_id = $2
   ORDER BY e.created_at, e.id`;

/** The same answer as findOrder's for another client's order or an id that cannot exist. */
export function orderNotFound(id: string): ProblemException {
  return ProblemException.of(404, 'order-not-found', 'Order not found', `There is no order ${id}.`);
}

function invalidTransition(order: OrderView, target: OrderStatus): ProblemException {
  return ProblemException.of(
    409,
    'invalid-transition',
    'Transition not allowed',
    `Order ${order.id} is ${order.status}: it cannot become ${target}.`,
    { currentStatus: order.status, allowedTransitions: [...nextStatuses(order.status)] },
    { ETag: versionEtag(order.version) },
  );
}

@Injectable()
export class OrdersService {
  constructor(private readonly db: Database) {}

  async createOrder(clientId: string, dto: CreateOrderDto): Promise<CreatedOrder> {
    // Plain copies: what is stored and compared is exactly the validated fields.
    const items = dto.items.map(({ sku, quantity, unitPriceMinor }) => ({ sku, quantity, unitPriceMinor }));
    const total = items.reduce((sum, i) => sum + i.quantity * i.unitPriceMinor, 0);
    const address = dto.shippingAddress ? canonicalJson(dto.shippingAddress) : null;
    const digest = creationDigest({ ...dto, items });
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
        digest,
      ]);
      if (row) return { order: toView(row), created: true };
      if (generated && attempt < 2) continue;
      const existing = await this.findByNumber(clientId, orderNumber);
      if (existing) {
        const order = toView(existing);
        // An order from before creation_digest existed (migration 1764414400000) can only be
        // compared with what it is now: the rule that held when it was created.
        const existingDigest = existing.creation_digest ?? creationDigest(order);
        if (existingDigest === digest) return { order, created: false };
      }
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
    if (!row) throw orderNotFound(id);
    return toView(row);
  }

  private async findByNumber(clientId: string, orderNumber: string): Promise<OrderRow | undefined> {
    const [row] = await this.db.query<OrderRow>(
      `SELECT ${ORDER_COLUMNS}, o.creation_digest FROM orders o WHERE o.client_id = $1 AND o.order_number = $2`,
      [clientId, orderNumber],
    );
    return row;
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

  /**
   * Moves an order to `target` (docs/contract.md#orders) with one conditional UPDATE, never check-then-update:
   * of concurrent requests exactly one moves it. Asking again for the status the order is
   * already in succeeds and writes nothing.
   */
  async transitionOrder(clientId: string, id: string, target: OrderStatus): Promise<TransitionResult> {
    if (!isUUID(id)) throw orderNotFound(id);
    const from = allowedFrom(target);
    return this.db.transaction(async () => {
      if (target === 'cancelled') await this.refuseWhilePaymentPending(clientId, id);
      for (let attempt = 0; ; attempt++) {
        const [row] = await this.db.query<OrderRow>(TRANSITION_ORDER, [id, clientId, target, from]);
        if (row) return { order: toView(row), changed: true };
        const current = await this.findOrder(clientId, id);
        if (current.status === target) return { order: current, changed: false };
        // Moved into an allowed status after the UPDATE looked (paid just now, say): the move is
        // valid after all. Statuses only go forward, so this happens at most once or twice.
        if (from.includes(current.status) && attempt < 2) continue;
        throw invalidTransition(current, target);
      }
    });
  }

  /**
   * A created order whose payment is still being decided cannot be cancelled: the charge may yet
   * succeed. The order's row lock comes first (a payer takes it too), and the check is a new
   * statement after it, so it sees a payment committed while this request waited for the lock.
   */
  private async refuseWhilePaymentPending(clientId: string, id: string): Promise<void> {
    await this.db.query(`SELECT 1 FROM orders WHERE id = $1 AND client_id = $2 FOR UPDATE`, [id, clientId]);
    const [pending] = await this.db.query<{ id: string }>(`SELECT id FROM payments WHERE order_id = $1 AND status = 'pending'`, [id]);
    if (pending) throw paymentInProgress(pending.id);
  }

  /**
   * Changes the shipping address and/or note if the order is still at one of `expectedVersions`
   * (from If-Match). A stale version is a 412 carrying the current ETag; nothing is written.
   */
  async updateOrderDetails(clientId: string, id: string, expectedVersions: number[], dto: UpdateOrderDto): Promise<OrderView> {
    if (dto.shippingAddress === undefined && dto.note === undefined) {
      const messages = ['send shippingAddress, note or both'];
      throw ProblemException.of(400, 'validation-failed', 'Validation failed', 'Send shippingAddress, note or both.', {
        errors: [
          { field: 'shippingAddress', messages },
          { field: 'note', messages },
        ],
      });
    }
    if (!isUUID(id)) throw orderNotFound(id);
    const [row] = await this.db.query<OrderRow>(UPDATE_ORDER_DETAILS, [
      id,
      clientId,
      expectedVersions,
      dto.shippingAddress !== undefined,
      dto.shippingAddress !== undefined ? canonicalJson(dto.shippingAddress) : null,
      dto.note !== undefined,
      dto.note ?? null,
      EDITABLE_STATUSES,
    ]);
    if (row) return toView(row);
    const current = await this.findOrder(clientId, id);
    // A status that forbids the change is reported first: re-reading the order would not help.
    if (!EDITABLE_STATUSES.includes(current.status)) {
      throw ProblemException.of(
        409,
        'order-not-editable',
        'Order can no longer be changed',
        `Order ${id} is ${current.status}: its shipping address and note can change only while it is ${EDITABLE_STATUSES.join(' or ')}.`,
        { currentStatus: current.status, editableStatuses: EDITABLE_STATUSES },
        { ETag: versionEtag(current.version) },
      );
    }
    throw ProblemException.of(
      412,
      'stale-version',
      'The order has changed',
      `Order ${id} is at version ${current.version}, not the one in If-Match. Read it again (GET /orders/${id}) and retry with its ETag.`,
      { currentVersion: current.version },
      { ETag: versionEtag(current.version) },
    );
  }

  /** An order's status changes, oldest first. */
  async listOrderEvents(clientId: string, id: string): Promise<OrderEventView[]> {
    if (!isUUID(id)) throw orderNotFound(id);
    const rows = await this.db.query<OrderEventRow>(LIST_ORDER_EVENTS, [id, clientId]);
    if (rows.length === 0) throw orderNotFound(id);
    return rows.flatMap((e) =>
      e.id === null
        ? []
        : [{ id: e.id, orderId: e.order_id, fromStatus: e.from_status, toStatus: e.to_status, createdAt: e.created_at.toISOString() }],
    );
  }
}
