import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { creationDigest } from '../src/orders/orders.service';
import { ALICE, BOB, bearer, startTestApp, type TestApp } from './support/test-app';

const order = (overrides: Record<string, unknown> = {}) => ({
  currency: 'EUR',
  items: [
    { sku: 'SKU-1', quantity: 2, unitPriceMinor: 1999 },
    { sku: 'SKU-2', quantity: 1, unitPriceMinor: 500 },
  ],
  ...overrides,
});

describe('orders: create, read, list', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(async () => {
    await t?.close();
  });

  // A fresh Idempotency-Key each time: these tests are about the natural key, not the dedupe table.
  const post = (body: unknown, client = ALICE) =>
    request(t.url)
      .post('/orders')
      .set('Authorization', bearer(client))
      .set('Idempotency-Key', randomUUID())
      .send(body as object);

  it('creates an order: 201, Location, ETag, server-computed total, generated number', async () => {
    const res = await post(order({ note: 'ring twice' }));
    expect(res.status).toBe(201);
    expect(res.headers['content-type']).toMatch(/^application\/json/);
    expect(res.headers.location).toBe(`/orders/${res.body.id}`);
    expect(res.headers.etag).toBe('"1"');
    expect(res.body).toMatchObject({
      status: 'created',
      currency: 'EUR',
      totalMinor: 2 * 1999 + 500,
      items: [
        { sku: 'SKU-1', quantity: 2, unitPriceMinor: 1999 },
        { sku: 'SKU-2', quantity: 1, unitPriceMinor: 500 },
      ],
      note: 'ring twice',
      shippingAddress: null,
      version: 1,
    });
    expect(res.body.orderNumber).toMatch(/^ord_[A-Za-z0-9_-]{16}$/);
    const { rows } = await t.db.query('SELECT total_minor, client_id FROM orders WHERE id = $1', [res.body.id]);
    expect(rows).toEqual([{ total_minor: '4498', client_id: 'alice' }]);
  });

  it('reads an order back with its ETag', async () => {
    const created = await post(
      order({ shippingAddress: { name: 'Ada', line1: '1 Main St', city: 'Paris', postalCode: '75001', country: 'FR' } }),
    );
    const res = await request(t.url).get(created.headers.location).set('Authorization', bearer(ALICE));
    expect(res.status).toBe(200);
    expect(res.headers.etag).toBe('"1"');
    expect(res.body).toEqual(created.body);
  });

  it('returns the existing order (200) for the same orderNumber and content, 409 for other content', async () => {
    const first = await post(order({ orderNumber: 'PO-7' }));
    expect(first.status).toBe(201);
    // Same content, fields in another order: still the same order.
    const again = await post({ items: order().items, currency: 'EUR', orderNumber: 'PO-7' });
    expect(again.status).toBe(200);
    expect(again.body).toEqual(first.body);
    const other = await post(order({ orderNumber: 'PO-7', currency: 'USD' }));
    expect(other.status).toBe(409);
    expect(other.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(other.body).toMatchObject({ type: 'urn:idempotent-orders:problem:order-number-conflict', status: 409, orderId: first.body.id });
    const { rows } = await t.db.query(`SELECT count(*)::int AS n FROM orders WHERE order_number = 'PO-7'`);
    expect(rows[0].n).toBe(1);
  });

  it('a retried create gets its order (200) after the order was edited; other content is still 409', async () => {
    const address = { name: 'Ada', line1: '1 Main St', city: 'Paris', postalCode: '75001', country: 'FR' };
    const create = order({ orderNumber: 'PO-EDITED', note: 'x', shippingAddress: address });
    const first = await post(create);
    expect(first.status).toBe(201);
    const edited = await request(t.url)
      .patch(first.headers.location)
      .set('Authorization', bearer(ALICE))
      .set('If-Match', first.headers.etag)
      .send({ note: 'y', shippingAddress: { ...address, line1: '2 Side St' } });
    expect(edited.status).toBe(200);
    // The client never saw the 201 and retries the create it made, under a new key.
    const retried = await post(create);
    expect(retried.status).toBe(200);
    // The order as it is now, edits included: the retry created nothing and changed nothing.
    expect(retried.body).toEqual(edited.body);
    // The comparison is with what the order was created from, not with what it has become.
    for (const other of [
      order({ orderNumber: 'PO-EDITED', note: 'y', shippingAddress: { ...address, line1: '2 Side St' } }),
      { ...create, currency: 'USD' },
      { ...create, note: undefined },
    ]) {
      const res = await post(other);
      expect(res.status).toBe(409);
      expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:order-number-conflict', orderId: first.body.id });
    }
    const { rows } = await t.db.query(
      `SELECT count(*)::int AS n, max(version) AS version, max(creation_digest) AS digest FROM orders WHERE order_number = 'PO-EDITED'`,
    );
    // Written by the INSERT, untouched by the PATCH.
    expect(rows[0]).toEqual({ n: 1, version: 2, digest: creationDigest(create) });
  });

  it('an order made before creation digests existed is compared with its current content', async () => {
    const first = await post(order({ orderNumber: 'PO-LEGACY', note: 'x' }));
    expect(first.status).toBe(201);
    // As migration 1764414400000 leaves the orders it finds.
    await t.db.query(`UPDATE orders SET creation_digest = NULL WHERE id = $1`, [first.body.id]);
    const again = await post(order({ note: 'x', orderNumber: 'PO-LEGACY' }));
    expect(again.status).toBe(200);
    expect(again.body.id).toBe(first.body.id);
    const other = await post(order({ orderNumber: 'PO-LEGACY', note: 'z' }));
    expect(other.status).toBe(409);
    const { rows } = await t.db.query(`SELECT count(*)::int AS n FROM orders WHERE order_number = 'PO-LEGACY'`);
    expect(rows[0].n).toBe(1);
  });

  it("order numbers are per client: bob may use alice's number", async () => {
    const a = await post(order({ orderNumber: 'SHARED-1' }), ALICE);
    const b = await post(order({ orderNumber: 'SHARED-1', currency: 'GBP' }), BOB);
    expect([a.status, b.status]).toEqual([201, 201]);
    expect(a.body.id).not.toBe(b.body.id);
  });

  it('20 concurrent creates of one orderNumber under different keys make one order and no 5xx', async () => {
    const statuses = await Promise.all(Array.from({ length: 20 }, () => post(order({ orderNumber: 'RACE-1' })).then((r) => r.status)));
    expect(statuses.filter((s) => s === 201)).toHaveLength(1);
    expect(statuses.filter((s) => s === 200)).toHaveLength(19);
    const { rows } = await t.db.query(
      `SELECT count(*)::int AS orders, (SELECT count(*)::int FROM order_items i JOIN orders o ON o.id = i.order_id WHERE o.order_number = 'RACE-1') AS lines
         FROM orders WHERE order_number = 'RACE-1'`,
    );
    expect(rows[0]).toEqual({ orders: 1, lines: 2 });
  });

  it('20 concurrent creates of one orderNumber with different contents: one order, the rest 409', async () => {
    const results = await Promise.all(
      Array.from({ length: 20 }, (_, i) => post(order({ orderNumber: 'RACE-2', note: `n${i}` })).then((r) => r.status)),
    );
    expect(results.filter((s) => s === 201)).toHaveLength(1);
    expect(results.filter((s) => s === 409)).toHaveLength(19);
    const { rows } = await t.db.query(`SELECT count(*)::int AS n FROM orders WHERE order_number = 'RACE-2'`);
    expect(rows[0].n).toBe(1);
  });

  it("another client's order is a 404, and so is an id that cannot exist", async () => {
    const created = await post(order());
    for (const path of [`/orders/${created.body.id}`, '/orders/not-a-uuid', '/orders/00000000-0000-4000-8000-000000000000']) {
      const res = await request(t.url).get(path).set('Authorization', bearer(BOB));
      expect(res.status).toBe(404);
      expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:order-not-found', status: 404 });
    }
    const list = await request(t.url).get('/orders').set('Authorization', bearer(BOB));
    expect(list.body.items.map((o: { id: string }) => o.id)).not.toContain(created.body.id);
  });
});

describe('orders: keyset pagination', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(async () => {
    await t?.close();
  });

  const list = (query: string, client = ALICE) => request(t.url).get(`/orders${query}`).set('Authorization', bearer(client));

  it('walks every order exactly once, newest first, even when rows share a timestamp', async () => {
    // 45 orders in one transaction share created_at: only the id tie-break orders them.
    await t.db.query(
      `INSERT INTO orders (client_id, order_number, currency, total_minor)
       SELECT 'alice', 'P-' || g, 'EUR', g FROM generate_series(1, 45) g`,
    );
    await t.db.query(
      `INSERT INTO orders (client_id, order_number, currency, total_minor, status) VALUES ('alice', 'P-late', 'EUR', 1, 'cancelled')`,
    );
    const seen: string[] = [];
    let cursor: string | null = null;
    let pages = 0;
    do {
      const res = await list(`?limit=10${cursor ? `&cursor=${cursor}` : ''}`);
      expect(res.status).toBe(200);
      expect(res.body.items.length).toBeLessThanOrEqual(10);
      seen.push(...res.body.items.map((o: { orderNumber: string }) => o.orderNumber));
      cursor = res.body.nextCursor;
      pages++;
    } while (cursor && pages < 20);
    expect(pages).toBe(5);
    expect(seen).toHaveLength(46);
    expect(new Set(seen).size).toBe(46);
    expect(seen[0]).toBe('P-late');
  });

  it('defaults to 20 a page and filters by status', async () => {
    const page = await list('');
    expect(page.body.items).toHaveLength(20);
    expect(page.body.nextCursor).toEqual(expect.any(String));
    const cancelled = await list('?status=cancelled');
    expect(cancelled.body).toEqual({ items: [expect.objectContaining({ orderNumber: 'P-late', status: 'cancelled' })], nextCursor: null });
  });

  it('refuses a bad limit, status or cursor with 400 problems', async () => {
    for (const query of [
      '?limit=0',
      '?limit=101',
      '?limit=abc',
      '?status=lost',
      '?cursor=garbage',
      `?cursor=${Buffer.from('["x","y"]').toString('base64url')}`,
    ]) {
      const res = await list(query);
      expect(res.status).toBe(400);
      expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
    }
  });

  it("shows bob none of alice's orders", async () => {
    const res = await list('', BOB);
    expect(res.body).toEqual({ items: [], nextCursor: null });
  });
});
