/**
 * Rotating an API key without a cutover: a client id may hold several keys at once (API_KEYS=shop:old,shop:new), so a
 * rotation is add → deploy → move the client to the new key → remove. While both are configured, requests with either
 * key are the same client: its orders, its Idempotency-Keys.
 */
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { BOB, startTestApp, type TestApp } from './support/test-app';

const OLD = 'shop-old-3f9c2a7be41d8056c3e9f1a27b6d4e08';
const NEW = 'shop-new-9a4e1c0b7d3f2859e6a1c4b0d7f3e291';

describe('API key rotation: two keys for one client id at once', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp({ API_KEYS: `shop:${OLD},shop:${NEW},${BOB.clientId}:${BOB.secret}`, PSP_WEBHOOK_URL: 'none' });
  });
  afterAll(async () => {
    await t?.close();
  });

  it('40 requests in flight, half with each key: none refused, every one the same client (its order, its key replayed)', async () => {
    const key = randomUUID();
    const body = { orderNumber: `ROT-${randomUUID()}`, currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 900 }] };
    const created = await request(t.url).post('/orders').set('Authorization', `Bearer ${OLD}`).set('Idempotency-Key', key).send(body);
    expect(created.status).toBe(201);
    const answers = await Promise.all(
      Array.from({ length: 40 }, (_, i) => {
        const secret = i % 2 === 0 ? OLD : NEW;
        return i % 4 < 2
          ? request(t.url)
              .get(`/orders/${created.body.id as string}`)
              .set('Authorization', `Bearer ${secret}`)
          : request(t.url).post('/orders').set('Authorization', `Bearer ${secret}`).set('Idempotency-Key', key).send(body);
      }),
    );
    expect(answers.map((r) => r.status).filter((s) => s !== 200 && s !== 201)).toEqual([]);
    expect(new Set(answers.map((r) => r.body.id as string))).toEqual(new Set([created.body.id]));
    const { rows } = await t.db.query(`SELECT count(*)::int AS n FROM orders WHERE order_number = $1`, [body.orderNumber]);
    expect(rows[0].n).toBe(1);
    // The key that is not the client's is still refused, and another client sees nothing of it.
    expect((await request(t.url).get('/orders').set('Authorization', 'Bearer shop-gone-00000000000000000000000000')).status).toBe(401);
    expect(
      (
        await request(t.url)
          .get(`/orders/${created.body.id as string}`)
          .set('Authorization', `Bearer ${BOB.secret}`)
      ).status,
    ).toBe(404);
  });
});
