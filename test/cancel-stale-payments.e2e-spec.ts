/**
 * A keyed cancel of an order whose payment was left pending (its request gave up: the provider's answer was lost)
 * settles that payment first — provider look-ups, a second apart — and only then opens the key's transaction. Settled
 * inside it, each cancel held a connection (and the key's lock) across the look-ups and needed a second connection
 * meanwhile: more concurrent cancels than the pool has connections exhausted it. Pool of 2, 6 cancels at once.
 */
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { ALICE, bearer, PSP_AUTH, startTestApp, type TestApp } from './support/test-app';

describe('keyed cancels of orders with a stale pending payment, more of them than the pool has connections', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp({
      DATABASE_POOL_SIZE: '2',
      DATABASE_POOL_WAIT_MS: '3000',
      PSP_TIMEOUT_MS: '500',
      PSP_MAX_ATTEMPTS: '3',
      IDEMPOTENCY_LEASE_SECONDS: '5',
      RECONCILE_INTERVAL_MS: '0',
      PSP_WEBHOOK_URL: 'none',
      PSP_BREAKER_THRESHOLD: '50',
    });
  });
  afterAll(async () => {
    await t?.close();
  });

  it('every cancel answers 200 (no 503 for the pool, no 500); each order cancelled, its lost charge settled once', async () => {
    const orders: string[] = [];
    for (let i = 0; i < 6; i++) {
      const created = await request(t.url)
        .post('/orders')
        .set('Authorization', bearer(ALICE))
        .set('Idempotency-Key', randomUUID())
        .send({ orderNumber: `STALE-${randomUUID()}`, currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 1200 }] });
      expect(created.status).toBe(201);
      const lost = await request(t.url)
        .post(`/orders/${created.body.id as string}/payments`)
        .set('Authorization', bearer(ALICE))
        .set('Idempotency-Key', randomUUID())
        .send({ source: 'tok_lost' });
      expect(lost.status).toBe(503);
      orders.push(created.body.id as string);
    }
    const cancels = await Promise.all(
      orders.map((id) =>
        request(t.url).post(`/orders/${id}/cancel`).set('Authorization', bearer(ALICE)).set('Idempotency-Key', randomUUID()),
      ),
    );
    expect(cancels.map((r) => `${r.status} ${r.status === 200 ? '' : JSON.stringify(r.body)}`)).toEqual(Array(6).fill('200 '));
    const { rows } = await t.db.query<{ status: string; payment: string; paid_events: number }>(
      `SELECT o.status, p.status AS payment,
              (SELECT count(*)::int FROM order_events e WHERE e.order_id = o.id AND e.to_status = 'paid') AS paid_events
         FROM orders o JOIN payments p ON p.order_id = o.id WHERE o.id = ANY($1) ORDER BY o.id`,
      [orders],
    );
    expect(rows).toEqual(Array(6).fill({ status: 'cancelled', payment: 'succeeded', paid_events: 1 }));
    for (const id of orders) {
      const charges = await request(t.url).get('/psp/charges').set('Authorization', PSP_AUTH).query({ orderId: id });
      expect(charges.status).toBe(200);
      expect(charges.body.items).toHaveLength(1);
    }
  });
});
