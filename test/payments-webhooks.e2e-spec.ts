import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Pool } from 'pg';
import request from 'supertest';
import { ALICE, bearer, createTestDatabase, startTestApp, type TestApp } from './support/test-app';
import { freePort } from '../src/common/free-port';

/** Deliveries retry with backoff; on a loaded machine give them time. */
const DEADLINE_MS = 40_000;

/**
 * Both ends of the webhooks at once: the sandbox's outbox relay delivers to this service's own
 * /webhooks/psp, and the consumer settles what the requests could not. The reconciler is off in
 * every app here, so only a webhook can settle a lost answer.
 */
describe('payments settled by the provider’s own webhooks (reconciler off)', () => {
  const WEBHOOK_ENV = { PSP_TIMEOUT_MS: '500', PSP_MAX_ATTEMPTS: '3', IDEMPOTENCY_LEASE_SECONDS: '5', RECONCILE_INTERVAL_MS: '0' };

  async function createOrder(t: TestApp): Promise<string> {
    const res = await request(t.url)
      .post('/orders')
      .set('Authorization', bearer(ALICE))
      .set('Idempotency-Key', randomUUID())
      .send({ currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 1200 }] });
    expect(res.status).toBe(201);
    return res.body.id as string;
  }

  const pay = (t: TestApp, orderId: string, source: string, key: string = randomUUID()) =>
    request(t.url).post(`/orders/${orderId}/payments`).set('Authorization', bearer(ALICE)).set('Idempotency-Key', key).send({ source });

  async function payUntilFinal(t: TestApp, orderId: string, source: string, key: string): Promise<request.Response> {
    const deadline = Date.now() + DEADLINE_MS;
    for (;;) {
      const res = await pay(t, orderId, source, key);
      if (res.status !== 409 && res.status !== 503) return res;
      if (Date.now() > deadline) throw new Error(`key ${key} still answers ${res.status} ${res.text}`);
      await sleep(Number(res.headers['retry-after'] ?? 1) * 1000);
    }
  }

  async function until<T>(what: string, probe: () => Promise<T | undefined>): Promise<T> {
    const deadline = Date.now() + DEADLINE_MS;
    for (;;) {
      const value = await probe();
      if (value !== undefined) return value;
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await sleep(50);
    }
  }

  async function paymentStatus(db: Pool, paymentId: string): Promise<string> {
    const { rows } = await db.query(`SELECT status FROM payments WHERE id = $1`, [paymentId]);
    return rows[0].status as string;
  }

  async function paidEvents(db: Pool, orderId: string): Promise<number> {
    const { rows } = await db.query(`SELECT count(*)::int AS n FROM order_events WHERE order_id = $1 AND to_status = 'paid'`, [orderId]);
    return rows[0].n as number;
  }

  describe('one app, delivering to itself', () => {
    let t: TestApp;
    beforeAll(async () => {
      t = await startTestApp({ ...WEBHOOK_ENV, PSP_WEBHOOK_DUPLICATES: 'true' });
    });
    afterAll(async () => {
      await t?.close();
    });

    it('tok_lost: the request answers 503, and charge.succeeded alone settles the payment, pays the order and completes the key', async () => {
      const orderId = await createOrder(t);
      const key = randomUUID();
      const lost = await pay(t, orderId, 'tok_lost', key);
      expect(lost.status).toBe(503);
      await until('the webhook to settle the payment', async () =>
        (await paymentStatus(t.db, lost.body.paymentId)) === 'succeeded' ? true : undefined,
      );
      const replay = await pay(t, orderId, 'tok_lost', key);
      expect(replay.status).toBe(201);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.body.id).toBe(lost.body.paymentId);
      expect(await paidEvents(t.db, orderId)).toBe(1);
    });

    it('duplicates and shuffled order on: every event arrives twice, each order is paid once with one history row', async () => {
      const orders = await Promise.all(Array.from({ length: 6 }, () => createOrder(t)));
      const keys = orders.map(() => randomUUID());
      await Promise.all(orders.map((orderId, i) => pay(t, orderId, 'tok_visa', keys[i])));
      // Each key to its final answer: a provider attempt that timed out on a loaded machine answered 503 payment-pending.
      const answers = await Promise.all(orders.map((orderId, i) => payUntilFinal(t, orderId, 'tok_visa', keys[i])));
      for (const res of answers) expect(res.status).toBe(201);
      // Every copy of every event delivered (two per charge) and processed once.
      const chargeIds = answers.map((a) => a.body.providerTransactionId as string);
      await until('both copies of every event to be delivered', async () => {
        const { rows } = await t.db.query(
          `SELECT count(*)::int AS n FROM psp.webhook_outbox WHERE delivered_at IS NOT NULL AND payload->>'chargeId' = ANY($1::text[])`,
          [chargeIds],
        );
        return rows[0].n === chargeIds.length * 2 ? true : undefined;
      });
      const { rows: processed } = await t.db.query(
        `SELECT count(*)::int AS n FROM processed_webhook_events e
          WHERE e.webhook_id IN (SELECT id FROM psp.webhook_outbox WHERE payload->>'chargeId' = ANY($1::text[]))`,
        [chargeIds],
      );
      expect(processed[0].n).toBe(chargeIds.length);
      for (const orderId of orders) expect(await paidEvents(t.db, orderId)).toBe(1);
    });
  });

  it('events written while the consumer is unreachable are delivered once it is back, and settle the payment', async () => {
    const database = await createTestDatabase();
    const db = new Pool({ connectionString: database.url, max: 2 });
    db.on('error', () => undefined);
    let first: TestApp | undefined;
    let second: TestApp | undefined;
    try {
      // The first app delivers to a port where nothing listens: every delivery fails and stays queued.
      first = await startTestApp(
        { ...WEBHOOK_ENV, PSP_WEBHOOK_URL: `http://127.0.0.1:${await freePort()}/webhooks/psp` },
        { databaseUrl: database.url },
      );
      const orderId = await createOrder(first);
      const key = randomUUID();
      const lost = await pay(first, orderId, 'tok_lost', key);
      expect(lost.status).toBe(503);
      await until('a failed delivery attempt', async () => {
        const { rows } = await db.query(`SELECT attempts FROM psp.webhook_outbox WHERE payload->>'paymentId' = $1`, [lost.body.paymentId]);
        return rows[0]?.attempts > 0 ? true : undefined;
      });
      expect(await paymentStatus(db, lost.body.paymentId)).toBe('pending');
      await first.close();
      first = undefined;

      // The same database, now with a service that receives its own webhooks.
      second = await startTestApp(WEBHOOK_ENV, { databaseUrl: database.url });
      await until('the queued event to settle the payment', async () =>
        (await paymentStatus(db, lost.body.paymentId)) === 'succeeded' ? true : undefined,
      );
      const replay = await pay(second, orderId, 'tok_lost', key);
      expect(replay.status).toBe(201);
      expect(replay.body.id).toBe(lost.body.paymentId);
      expect(await paidEvents(db, orderId)).toBe(1);
    } finally {
      await first?.close();
      await second?.close();
      await db.end();
      await database.drop();
    }
  }, 120_000);
});
