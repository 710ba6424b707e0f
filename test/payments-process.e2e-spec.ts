import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Pool } from 'pg';
import request from 'supertest';
import { startServiceProcess, type ServiceProcess } from './support/service-process';
import { ALICE, BOB, bearer, createTestDatabase, PSP_AUTH } from './support/test-app';

/** Service starts and restarts on a loaded 2-core machine take their time. */
const PROCESS_TEST_TIMEOUT_MS = 180_000;
/** How long a test waits for something it polls for, on a loaded 2-core machine. */
const DEADLINE_MS = 60_000;

/**
 * Payments as production runs them: the built service as its own OS process, killed with SIGKILL
 * while charges are in flight, and two instances sharing one database. After each, the database
 * and the provider's ledger must show exactly one succeeded charge per order.
 */
describe('payments across processes: SIGKILL mid-flight, two instances on one database', () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let db: Pool;
  const started: ServiceProcess[] = [];

  beforeAll(async () => {
    database = await createTestDatabase();
    db = new Pool({ connectionString: database.url, max: 2 });
    db.on('error', () => undefined);
  });
  afterAll(async () => {
    await Promise.all(started.map((p) => p.kill('SIGKILL')));
    await db?.end();
    await database?.drop();
  });

  async function start(): Promise<ServiceProcess> {
    const service = await startServiceProcess({
      DATABASE_URL: database.url,
      API_KEYS: `${ALICE.clientId}:${ALICE.secret},${BOB.clientId}:${BOB.secret}`,
      // tok_lost and tok_timeout hold their answers 3 × this: long enough to kill the service in between.
      PSP_TIMEOUT_MS: '500',
      PSP_MAX_ATTEMPTS: '3',
      IDEMPOTENCY_LEASE_SECONDS: '4',
      RECONCILE_INTERVAL_MS: '0',
    });
    started.push(service);
    return service;
  }

  async function createOrder(url: string): Promise<string> {
    const res = await request(url)
      .post('/orders')
      .set('Authorization', bearer(ALICE))
      .set('Idempotency-Key', randomUUID())
      .send({ currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 1500 }] });
    expect(res.status).toBe(201);
    return res.body.id as string;
  }

  const pay = (url: string, orderId: string, source: string, key: string) =>
    request(url).post(`/orders/${orderId}/payments`).set('Authorization', bearer(ALICE)).set('Idempotency-Key', key).send({ source });

  /** Retries one key as a well-behaved client does (honouring Retry-After) until it gets a final answer. */
  async function payUntilFinal(url: string, orderId: string, source: string, key: string): Promise<request.Response> {
    const deadline = Date.now() + DEADLINE_MS;
    for (;;) {
      const res = await pay(url, orderId, source, key);
      if (res.status !== 409 && res.status !== 503) return res;
      if (Date.now() > deadline) throw new Error(`key ${key} still answers ${res.status} ${res.text}`);
      await sleep(Number(res.headers['retry-after'] ?? 1) * 1000);
    }
  }

  async function ledger(url: string, orderId: string): Promise<{ status: string }[]> {
    const res = await request(url).get('/psp/charges').set('Authorization', PSP_AUTH).query({ orderId });
    expect(res.status).toBe(200);
    return res.body.items;
  }

  async function expectPaidOnce(url: string, orderId: string, paymentId: string): Promise<void> {
    const { rows } = await db.query(
      `SELECT p.id, p.status, o.status AS order_status,
              (SELECT count(*)::int FROM order_events e WHERE e.order_id = o.id AND e.to_status = 'paid') AS paid_events
         FROM payments p JOIN orders o ON o.id = p.order_id WHERE p.order_id = $1 AND p.status <> 'failed'`,
      [orderId],
    );
    expect(rows).toEqual([{ id: paymentId, status: 'succeeded', order_status: 'paid', paid_events: 1 }]);
    expect((await ledger(url, orderId)).filter((c) => c.status === 'succeeded')).toHaveLength(1);
  }

  it(
    'SIGKILL while charges are recorded but unanswered: after a restart every key resumes to exactly one charge per order',
    async () => {
      const first = await start();
      const orders = await Promise.all(Array.from({ length: 6 }, () => createOrder(first.url)));
      const sources = orders.map((_, i) => (i % 2 === 0 ? 'tok_lost' : 'tok_timeout'));
      const keys = orders.map(() => randomUUID());
      // In flight when the process dies: their answers are lost with it.
      const inFlight = orders.map((orderId, i) =>
        pay(first.url, orderId, sources[i], keys[i]).then(
          (res) => res.status,
          () => 'cut off',
        ),
      );
      // The provider has recorded every charge: the moment a crash leaves "charged, not recorded by us".
      const deadline = Date.now() + DEADLINE_MS;
      for (const orderId of orders) {
        while ((await ledger(first.url, orderId)).length === 0) {
          if (Date.now() > deadline) throw new Error('the provider never recorded the charges');
          await sleep(50);
        }
      }
      await first.kill('SIGKILL');
      await Promise.all(inFlight);

      const second = await start();
      const answers = await Promise.all(orders.map((orderId, i) => payUntilFinal(second.url, orderId, sources[i], keys[i])));
      for (const [i, res] of answers.entries()) {
        expect(res.status).toBe(201);
        await expectPaidOnce(second.url, orders[i], res.body.id);
      }
      const { rows } = await db.query(`SELECT count(*)::int AS n FROM idempotency_keys WHERE state = 'in_progress'`);
      expect(rows[0].n).toBe(0);
    },
    PROCESS_TEST_TIMEOUT_MS,
  );

  it(
    'two instances, one key sent to both at once: one charge, and both answer with the same payment',
    async () => {
      const [a, b] = await Promise.all([start(), start()]);
      const orderId = await createOrder(a.url);
      const key = randomUUID();
      const answers = await Promise.all(Array.from({ length: 10 }, (_, i) => pay(i % 2 ? a.url : b.url, orderId, 'tok_slow', key)));
      // 409 while another copy holds the lease; 503 payment-pending when a provider attempt timed out on a loaded machine.
      for (const res of answers) expect([201, 409, 503]).toContain(res.status);
      const final = await payUntilFinal(a.url, orderId, 'tok_slow', key);
      const viaB = await payUntilFinal(b.url, orderId, 'tok_slow', key);
      expect(final.status).toBe(201);
      expect(viaB.text).toBe(final.text);
      await expectPaidOnce(a.url, orderId, final.body.id);
    },
    PROCESS_TEST_TIMEOUT_MS,
  );
});
