import { randomUUID } from 'node:crypto';
import { Client } from 'pg';
import request from 'supertest';
import { ALICE, bearer, ignoreIdleErrors, startTestApp, type TestApp } from './support/test-app';

async function until(done: () => boolean, deadlineMs = 5_000): Promise<void> {
  const deadline = Date.now() + deadlineMs;
  while (!done()) {
    if (Date.now() > deadline) throw new Error(`not within ${deadlineMs} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** The outbox with no broker (AMQP_URL unset: the relay is off and the events wait): every change has exactly its event. */
describe('order events outbox: one event per change, written with it', () => {
  let t: TestApp;
  let numbers = 0;

  beforeAll(async () => {
    t = await startTestApp({ RECONCILE_INTERVAL_MS: '0', PSP_WEBHOOK_URL: 'none' });
  });
  afterAll(async () => {
    await t?.close();
  });

  const create = (orderNumber = `EV-${++numbers}`, unitPriceMinor = 1250) =>
    request(t.url)
      .post('/orders')
      .set('Authorization', bearer(ALICE))
      .set('Idempotency-Key', randomUUID())
      .send({ orderNumber, currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 2, unitPriceMinor }] });
  const move = (id: string, action: 'cancel' | 'ship' | 'deliver') =>
    request(t.url).post(`/orders/${id}/${action}`).set('Authorization', bearer(ALICE));
  const pay = (id: string) =>
    request(t.url)
      .post(`/orders/${id}/payments`)
      .set('Authorization', bearer(ALICE))
      .set('Idempotency-Key', randomUUID())
      .send({ source: 'tok_visa' });

  async function eventsOf(orderId: string) {
    const { rows } = await t.db.query(
      `SELECT event_id, type, order_id, client_id, order_version, payload, sent_at FROM order_events_outbox WHERE order_id = $1 ORDER BY order_version`,
      [orderId],
    );
    return rows;
  }

  it('a create writes order.created with the contract body; repeating it writes nothing more', async () => {
    const res = await create('EV-contract');
    expect(res.status).toBe(201);
    const order = res.body;
    const [event, ...more] = await eventsOf(order.id);
    expect(more).toEqual([]);
    expect(event).toMatchObject({ type: 'order.created', order_id: order.id, client_id: 'alice', order_version: 1, sent_at: null });
    expect(event.event_id).toMatch(UUID);
    expect(event.payload).toEqual({
      eventId: event.event_id,
      type: 'order.created',
      orderId: order.id,
      clientId: 'alice',
      orderVersion: 1,
      totalMinor: 2500,
      currency: 'EUR',
      occurredAt: order.createdAt,
    });
    // The same create again (another key, same order number and content): the existing order, no second event.
    const again = await create('EV-contract');
    expect(again.status).toBe(200);
    expect(await eventsOf(order.id)).toHaveLength(1);
  });

  it('15 parallel creates of one order number: one order, one order.created', async () => {
    const answers = await Promise.all(Array.from({ length: 15 }, () => create('EV-race-create')));
    expect(answers.map((r) => r.status).sort((a, b) => a - b)).toEqual([...Array(14).fill(200), 201]);
    const { rows } = await t.db.query(
      `SELECT count(*)::int AS events, count(DISTINCT e.order_id)::int AS orders
         FROM order_events_outbox e JOIN orders o ON o.id = e.order_id WHERE o.order_number = 'EV-race-create'`,
    );
    expect(rows[0]).toEqual({ events: 1, orders: 1 });
  });

  it('15 parallel cancels of one order: one order.cancelled, at the version the cancel made', async () => {
    const id = (await create()).body.id as string;
    const answers = await Promise.all(Array.from({ length: 15 }, () => move(id, 'cancel')));
    expect(answers.every((r) => r.status === 200)).toBe(true);
    const events = await eventsOf(id);
    expect(events.map((e) => [e.type, e.order_version])).toEqual([
      ['order.created', 1],
      ['order.cancelled', 2],
    ]);
    expect(events[1].payload).toMatchObject({ type: 'order.cancelled', orderVersion: 2, totalMinor: 2500, currency: 'EUR' });
  });

  it('paid, cancelled, refunded: one event each, versions as the order counted them; ship and deliver have none', async () => {
    const refunded = (await create()).body.id as string;
    const payment = await pay(refunded);
    expect(payment.status).toBe(201);
    expect((await move(refunded, 'cancel')).status).toBe(200);
    // The whole amount back: the order becomes refunded.
    const refund = await request(t.url)
      .post(`/payments/${payment.body.id}/refunds`)
      .set('Authorization', bearer(ALICE))
      .set('Idempotency-Key', randomUUID())
      .send({});
    expect(refund.status).toBe(201);
    const { rows } = await t.db.query(`SELECT status, version FROM orders WHERE id = $1`, [refunded]);
    expect(rows[0]).toEqual({ status: 'refunded', version: 4 });
    const events = await eventsOf(refunded);
    expect(events.map((e) => [e.type, e.order_version])).toEqual([
      ['order.created', 1],
      ['order.paid', 2],
      ['order.cancelled', 3],
      ['order.refunded', 4],
    ]);
    expect(events.map((e) => e.payload.orderVersion)).toEqual([1, 2, 3, 4]);

    const delivered = (await create()).body.id as string;
    expect((await pay(delivered)).status).toBe(201);
    expect((await move(delivered, 'ship')).status).toBe(200);
    expect((await move(delivered, 'deliver')).status).toBe(200);
    expect((await eventsOf(delivered)).map((e) => e.type)).toEqual(['order.created', 'order.paid']);
  });

  it('races of pays and cancels on 20 orders: each event type counts exactly the history rows of that status', async () => {
    const ids = await Promise.all(Array.from({ length: 20 }, async () => (await create()).body.id as string));
    // Per order: 3 pays and 3 cancels at once. Whatever wins, the outbox must mirror the history.
    await Promise.all(ids.flatMap((id) => [pay(id), pay(id), pay(id), move(id, 'cancel'), move(id, 'cancel'), move(id, 'cancel')]));
    const { rows } = await t.db.query(
      `SELECT o.id, o.version,
              (SELECT count(*)::int FROM order_events h WHERE h.order_id = o.id AND h.to_status IN ('paid', 'cancelled', 'refunded')) AS changes,
              (SELECT count(*)::int FROM order_events_outbox e WHERE e.order_id = o.id AND e.type <> 'order.created') AS events,
              (SELECT count(*)::int FROM order_events h
                 WHERE h.order_id = o.id AND h.to_status IN ('paid', 'cancelled', 'refunded')
                   AND NOT EXISTS (SELECT 1 FROM order_events_outbox e WHERE e.order_id = o.id AND e.type = 'order.' || h.to_status)) AS unmatched,
              (SELECT max(order_version) FROM order_events_outbox e WHERE e.order_id = o.id) AS last_event_version
         FROM orders o WHERE o.id = ANY($1::uuid[])`,
      [ids],
    );
    expect(rows).toHaveLength(20);
    for (const row of rows) {
      expect(row.changes).toBeGreaterThanOrEqual(1);
      expect(row).toMatchObject({ events: row.changes, unmatched: 0, last_event_version: row.version });
    }
  });

  it('AMQP_URL unset: /health says the relay is off (and stays 200), and the events wait unsent', async () => {
    const id = (await create()).body.id as string;
    const health = await request(t.url).get('/health');
    expect(health.status).toBe(200);
    expect(health.body).toMatchObject({ status: 'ok', orderEventsRelay: 'off' });
    expect(await eventsOf(id)).toMatchObject([{ type: 'order.created', sent_at: null }]);
    const { rows } = await t.db.query(`SELECT count(*)::int AS n FROM order_events_outbox WHERE sent_at IS NOT NULL OR attempts > 0`);
    expect(rows[0].n).toBe(0);
  });

  it('the outbox rejects a second event for one version of an order (uq_order_events_outbox_order_version)', async () => {
    const id = (await create()).body.id as string;
    const [created] = await eventsOf(id);
    await expect(
      t.db.query(
        `INSERT INTO order_events_outbox (event_id, type, order_id, client_id, order_version, payload) VALUES ($1, 'order.created', $2, 'alice', 1, $3)`,
        [randomUUID(), id, created.payload],
      ),
    ).rejects.toMatchObject({ code: '23505', constraint: 'uq_order_events_outbox_order_version' });
  });

  it('a create and a transition send no NOTIFY (a notifying commit would serialise every create on a server-wide lock)', async () => {
    const listener = ignoreIdleErrors(new Client({ connectionString: t.databaseUrl }));
    await listener.connect();
    try {
      await listener.query('LISTEN order_events_outbox');
      const heard: string[] = [];
      listener.on('notification', (n) => heard.push(n.payload ?? ''));
      const id = (await create()).body.id as string;
      expect((await move(id, 'cancel')).status).toBe(200);
      // Notifications arrive in commit order: once the test's own (committed after both) is heard, none came before it.
      await t.db.query(`SELECT pg_notify('order_events_outbox', 'control')`);
      await until(() => heard.length > 0);
      expect(heard).toEqual(['control']);
      expect((await eventsOf(id)).map((e) => e.type)).toEqual(['order.created', 'order.cancelled']);
    } finally {
      await listener.end();
    }
  });
});
