import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Pool } from 'pg';
import request from 'supertest';
import { FaultPath } from './support/fault-path';
import { providerMoney } from './support/provider-ledger';
import { SANDBOX_MAIN, type ServiceProcess, startServiceProcess } from './support/service-process';
import { ALICE, bearer, createTestDatabase, PSP_AUTH, WEBHOOK_SECRET } from './support/test-app';

/**
 * The repairs of money that lands late must never stall: not while the provider is away (the reconciler must not
 * spin, must still sweep, must stop in time), not with RECONCILE_INTERVAL_MS=0 (a late charge's refund is retried
 * on its own schedule), not for rows an older build failed, and not when a 4xx follows an attempt that may land.
 * The service runs as `npm start` runs it (its own process), the sandbox provider as `npm run psp` does, and
 * between them a FaultPath that cuts, loses, delays or refuses what the service sends.
 */
const PROCESS_TEST_TIMEOUT_MS = 240_000;
/** How long a test waits for something it polls for, on a loaded 2-core machine. */
const DEADLINE_MS = 90_000;
const ORDER_TOTAL = 1_500;
const PROBLEM = (name: string) => `urn:idempotent-orders:problem:${name}`;
/** graceful-stop.ts cuts a stop short (exit 1) after 10 s: a stop must end well before, by itself. */
const DRAIN_BOUND_MS = 10_000;

interface World {
  db: Pool;
  databaseUrl: string;
  path: FaultPath;
  pathUrl: string;
  sandbox: ServiceProcess;
  service: ServiceProcess;
  /** Starts (another) service process on the same database and path. */
  startService(): Promise<ServiceProcess>;
  close(): Promise<void>;
}

async function startWorld(serviceEnv: Record<string, string>, { webhooks }: { webhooks: boolean }): Promise<World> {
  const path = new FaultPath();
  const pathUrl = await path.start();
  const started: ServiceProcess[] = [];
  const database = await createTestDatabase();
  // The provider keeps its ledger in a database of its own, so that the service's database counts only the service.
  const providerDatabase = await createTestDatabase();
  const db = new Pool({ connectionString: database.url, max: 2 });
  db.on('error', () => undefined);
  const close = async () => {
    await Promise.all(started.map((p) => p.kill('SIGKILL')));
    await path.stop();
    await db.end();
    await database.drop();
    await providerDatabase.drop();
  };
  const startService = async () => {
    const service = await startServiceProcess({
      DATABASE_URL: database.url,
      API_KEYS: `${ALICE.clientId}:${ALICE.secret}`,
      PSP_BASE_URL: `${pathUrl}/psp`,
      PSP_WEBHOOK_SECRET: WEBHOOK_SECRET,
      PSP_TIMEOUT_MS: '300',
      PSP_MAX_ATTEMPTS: '3',
      IDEMPOTENCY_LEASE_SECONDS: '5',
      // Every pay of an outage fails its call: the breaker must not turn the next ones away before they are pending.
      PSP_BREAKER_THRESHOLD: '1000',
      ...serviceEnv,
    });
    started.push(service);
    return service;
  };
  try {
    const service = await startService();
    const sandbox = await startServiceProcess(
      {
        DATABASE_URL: providerDatabase.url,
        PSP_PORT: '0',
        PSP_TIMEOUT_MS: '300',
        PSP_WEBHOOK_URL: webhooks ? `${service.url}/webhooks/psp` : 'none',
        PSP_WEBHOOK_SECRET: WEBHOOK_SECRET,
      },
      { main: SANDBOX_MAIN },
    );
    started.push(sandbox);
    path.target = sandbox.url;
    return { db, databaseUrl: database.url, path, pathUrl, sandbox, service, startService, close };
  } catch (err) {
    await close();
    throw err;
  }
}

async function createOrder(url: string): Promise<string> {
  const res = await request(url)
    .post('/orders')
    .set('Authorization', bearer(ALICE))
    .set('Idempotency-Key', randomUUID())
    .send({ currency: 'EUR', items: [{ sku: 'REPAIR-1', quantity: 1, unitPriceMinor: ORDER_TOTAL }] });
  expect(res.status).toBe(201);
  return res.body.id as string;
}

const pay = (url: string, orderId: string, key: string) =>
  request(url)
    .post(`/orders/${orderId}/payments`)
    .set('Authorization', bearer(ALICE))
    .set('Idempotency-Key', key)
    .send({ source: 'tok_visa' });

/** Polls until `check` returns a value, or fails after the deadline naming `what`. */
async function until<T>(what: string, check: () => Promise<T | undefined>, deadlineMs = DEADLINE_MS): Promise<T> {
  const deadline = Date.now() + deadlineMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(200);
  }
}

/** A payment failed as never reached, as an older build leaves it: no provider_attempts row. */
async function paymentFailedTheOldWay(w: World, orderId: string): Promise<{ paymentId: string }> {
  const paymentId = randomUUID();
  await w.db.query(
    `INSERT INTO payments (id, client_id, order_id, amount_minor, currency, source, outbound_key, status, failure_code)
     VALUES ($1, $2, $3, $4, 'EUR', 'tok_visa', $5, 'failed', 'provider_unreachable')`,
    [paymentId, ALICE.clientId, orderId, ORDER_TOTAL, `pay_${paymentId}`],
  );
  return { paymentId };
}

/**
 * A payment as an older build leaves it (no provider_attempts row): failed as never reached. Then its charge
 * lands at the provider after all, straight from the provider's API (what a late attempt of it would do).
 */
async function paymentFailedTheOldWayWithALateCharge(w: World, orderId: string): Promise<{ paymentId: string; chargeId: string }> {
  const { paymentId } = await paymentFailedTheOldWay(w, orderId);
  const charge = await request(w.sandbox.url)
    .post('/psp/charges')
    .set('Authorization', PSP_AUTH)
    .set('Idempotency-Key', `pay_${paymentId}`)
    .send({ amountMinor: ORDER_TOTAL, currency: 'EUR', source: 'tok_visa', metadata: { orderId, paymentId } });
  expect(charge.status).toBe(201);
  return { paymentId, chargeId: charge.body.id as string };
}

/** What our books say the customer paid for the order, net of refunds. */
async function booksNet(w: World, orderId: string): Promise<number> {
  const { rows } = await w.db.query(
    `SELECT (SELECT coalesce(sum(amount_minor), 0) FROM payments WHERE order_id = $1 AND status = 'succeeded')
          - (SELECT coalesce(sum(r.amount_minor), 0) FROM refunds r JOIN payments p ON p.id = r.payment_id WHERE p.order_id = $1 AND r.status = 'succeeded') AS net`,
    [orderId],
  );
  return Number(rows[0].net);
}

/** The service database's committed transactions so far (every statement outside a transaction is one). */
async function commits(w: World): Promise<number> {
  await w.db.query(`SELECT pg_stat_force_next_flush()`).catch(() => undefined);
  const { rows } = await w.db.query(`SELECT xact_commit::float8 AS n FROM pg_stat_database WHERE datname = current_database()`);
  return Number(rows[0].n);
}

async function metric(url: string, line: RegExp): Promise<number | undefined> {
  const text = (await request(url).get('/metrics')).text;
  const found = text.split('\n').find((l) => line.test(l));
  return found ? Number(found.split(' ').pop()) : undefined;
}

const lines = (output: string) => output.split('\n').filter((l) => l.trim() !== '');

describe('a provider outage: the reconciler neither spins nor stalls', () => {
  let w: World;
  /** The instance started once the provider is back (the first one is stopped by the first test). */
  let live: ServiceProcess | undefined;
  beforeAll(async () => {
    w = await startWorld({ RECONCILE_INTERVAL_MS: '500' }, { webhooks: false });
  }, PROCESS_TEST_TIMEOUT_MS);
  afterAll(async () => {
    await w?.close();
  });

  it(
    '25 pays pending with the provider down: bounded writes and log lines, the sweep runs, SIGTERM exits in time; the provider back, all settle',
    async () => {
      const PAYS = 25;
      const MEASURE_MS = 8_000;
      const orders = await Promise.all(Array.from({ length: PAYS }, () => createOrder(w.service.url)));
      w.path.down = true;
      const answers = await Promise.all(orders.map((orderId) => pay(w.service.url, orderId, randomUUID())));
      for (const res of answers) {
        expect(res.status).toBe(503);
        expect(res.body.type).toBe(PROBLEM('payment-pending'));
      }
      const { rows: pending } = await w.db.query(
        `SELECT count(*)::int AS n FROM payments WHERE order_id = ANY($1::uuid[]) AND status = 'pending'`,
        [orders],
      );
      expect(pending[0].n).toBe(PAYS);
      // A row due on the sweep's list: it is asked about (its recheck_at moves on) only if the run reaches the sweep.
      const swept = randomUUID();
      await w.db.query(
        `INSERT INTO provider_attempts (subject_id, subject, last_attempt_by, unreached_at, recheck_at) VALUES ($1, 'payment', now() - interval '2 hours', now() - interval '2 hours', now() - interval '1 second')`,
        [swept],
      );
      // A row at its last look (failed longer ago than PSP_KEY_RETENTION_HOURS): a look that cannot be made keeps it on the list.
      const lastLook = await createOrder(w.service.url);
      const { paymentId: lastLookId } = await paymentFailedTheOldWay(w, lastLook);
      await w.db.query(
        `INSERT INTO provider_attempts (subject_id, subject, last_attempt_by, unreached_at, recheck_at) VALUES ($1, 'payment', now() - interval '25 hours', now() - interval '25 hours', now() - interval '1 second')`,
        [lastLookId],
      );
      await until('the reconciler to find the provider away', () =>
        Promise.resolve(w.service.output().includes('the provider could not be asked') ? true : undefined),
      );
      await until('the sweep to run during the outage', async () => {
        const { rows } = await w.db.query(`SELECT recheck_at > now() AS moved FROM provider_attempts WHERE subject_id = $1`, [swept]);
        return rows[0].moved ? true : undefined;
      });

      await until('the last look to be claimed by the sweep', async () => {
        const { rows } = await w.db.query(`SELECT recheck_at > now() AS moved FROM provider_attempts WHERE subject_id = $1`, [lastLookId]);
        return rows[0].moved ? true : undefined;
      });

      // The idle service, the provider away, a run every 500 ms: what it writes and logs per second stays small (measured
      // here ~14 transactions, most of them the sweep's claim of due rows, and ~1.3 lines a second; the loop it replaces
      // made ~1,100 transactions and ~500 warn lines a second).
      const commitsBefore = await commits(w);
      const linesBefore = lines(w.service.output()).length;
      const started = Date.now();
      await sleep(MEASURE_MS); // a measurement window, not a synchronisation
      const seconds = (Date.now() - started) / 1000;
      const commitsPerSecond = ((await commits(w)) - commitsBefore) / seconds;
      const linesPerSecond = (lines(w.service.output()).length - linesBefore) / seconds;
      expect(commitsPerSecond).toBeLessThan(25);
      expect(linesPerSecond).toBeLessThan(3);
      // Every pay was an expected 503: none of them is logged as an error, none with a stack.
      const logged = lines(w.service.output());
      expect(logged.filter((l) => l.includes('payment-pending')).length).toBeGreaterThan(0);
      expect(
        logged.filter(
          (l) => l.includes('unhandled error') || (l.includes('payment-pending') && (l.includes('"level":50') || l.includes('"stack"'))),
        ),
      ).toEqual([]);

      const stopStarted = Date.now();
      expect(await w.service.kill('SIGTERM')).toBe(0);
      expect(Date.now() - stopStarted).toBeLessThan(DRAIN_BOUND_MS / 2);

      // The provider back, a new instance on the same database settles every payment (none reached the provider: failed).
      w.path.down = false;
      live = await w.startService();
      await until(
        'every payment of the outage to settle',
        async () => {
          const { rows } = await w.db.query(
            `SELECT count(*)::int AS n FROM payments WHERE order_id = ANY($1::uuid[]) AND status = 'pending'`,
            [orders],
          );
          return rows[0].n === 0 ? true : undefined;
        },
        150_000,
      );
      // The last look, unanswered in the outage, was asked again once the provider was back; answered (nothing there), it ends.
      await until('the last look to be answered', async () => {
        const { rows } = await w.db.query(`SELECT recheck_at FROM provider_attempts WHERE subject_id = $1`, [lastLookId]);
        return rows[0].recheck_at === null ? true : undefined;
      });
      const { rows: keys } = await w.db.query(
        `SELECT count(*)::int AS n FROM idempotency_keys k JOIN payments p ON p.idempotency_key_id = k.id WHERE p.order_id = ANY($1::uuid[]) AND k.state = 'completed'`,
        [orders],
      );
      expect(keys[0].n).toBe(PAYS);
      for (const orderId of orders.slice(0, 3)) expect((await providerMoney(w.sandbox.url, orderId)).net).toBe(await booksNet(w, orderId));
    },
    PROCESS_TEST_TIMEOUT_MS,
  );

  it(
    'a payment an older build failed as never reached (no provider_attempts row) whose charge lands later: found by the sweep and refunded',
    async () => {
      w.path.down = false;
      live ??= await w.startService();
      const orderId = await createOrder(live.url);
      const { paymentId, chargeId } = await paymentFailedTheOldWayWithALateCharge(w, orderId);
      const refunded = await until('the late charge to be refunded', async () => {
        const { rows } = await w.db.query(`SELECT status, charge_id FROM late_charge_refunds WHERE payment_id = $1`, [paymentId]);
        return rows[0]?.status === 'succeeded' ? rows[0] : undefined;
      });
      expect(refunded.charge_id).toBe(chargeId);
      const { rows } = await w.db.query(`SELECT unreached_at IS NOT NULL AS adopted FROM provider_attempts WHERE subject_id = $1`, [
        paymentId,
      ]);
      expect(rows).toEqual([{ adopted: true }]);
      expect(await providerMoney(w.sandbox.url, orderId)).toEqual({ net: 0, charges: 1 });
      expect(await booksNet(w, orderId)).toBe(0);
    },
    PROCESS_TEST_TIMEOUT_MS,
  );
});

describe('RECONCILE_INTERVAL_MS=0: a late charge is refunded on the refunder own schedule', () => {
  let w: World;
  beforeAll(async () => {
    w = await startWorld({ RECONCILE_INTERVAL_MS: '0' }, { webhooks: true });
  }, PROCESS_TEST_TIMEOUT_MS);
  afterAll(async () => {
    await w?.close();
  });

  it(
    'the webhook finds the late charge, the first refund attempt times out: retried until refunded, the ledger equal to the books',
    async () => {
      const orderId = await createOrder(w.service.url);
      // Every attempt of the first refund call is lost on the way (each times out): its outcome is unknown.
      w.path.script('/psp/refunds', [{ kind: 'lose' }, { kind: 'lose' }, { kind: 'lose' }]);
      const { paymentId } = await paymentFailedTheOldWayWithALateCharge(w, orderId);
      const pendingAfterFirst = await until('the first refund attempt to end unknown', async () => {
        const { rows } = await w.db.query(`SELECT status, attempts FROM late_charge_refunds WHERE payment_id = $1`, [paymentId]);
        return rows[0]?.attempts >= 1 && w.service.output().includes('late charge refund outcome unknown') ? rows[0] : undefined;
      });
      expect(pendingAfterFirst.status).toBe('pending');
      expect(await metric(w.service.url, /^payments_late_charge_refunds_pending\{state="retrying"\}/)).toBe(1);
      const done = await until('the late charge to be refunded', async () => {
        const { rows } = await w.db.query(`SELECT status, attempts FROM late_charge_refunds WHERE payment_id = $1`, [paymentId]);
        return rows[0]?.status === 'succeeded' ? rows[0] : undefined;
      });
      expect(done.attempts).toBeGreaterThanOrEqual(2);
      expect(await providerMoney(w.sandbox.url, orderId)).toEqual({ net: 0, charges: 1 });
      expect(await booksNet(w, orderId)).toBe(0);
      expect(await metric(w.service.url, /^payments_late_charge_refunds_pending\{state="retrying"\}/)).toBe(0);
    },
    PROCESS_TEST_TIMEOUT_MS,
  );
});

describe('a 4xx after an attempt that may still land is not final', () => {
  const MAX_LATENCY_MS = 4_000;
  let w: World;
  beforeAll(async () => {
    w = await startWorld({ RECONCILE_INTERVAL_MS: '500', PSP_MAX_LATENCY_MS: String(MAX_LATENCY_MS) }, { webhooks: false });
  }, PROCESS_TEST_TIMEOUT_MS);
  afterAll(async () => {
    await w?.close();
  });

  const paymentOf = async (id: string) =>
    (
      await w.db.query(
        `SELECT p.status, p.failure_code, p.provider_transaction_id,
                extract(epoch FROM p.updated_at - a.last_attempt_by) * 1000 AS decided_after_ms
           FROM payments p JOIN provider_attempts a ON a.subject_id = p.id WHERE p.id = $1`,
        [id],
      )
    ).rows[0];

  it(
    'a timeout, then a 422 on the retry, nothing landed: pending until the landing window closes, then failed by lookups',
    async () => {
      const orderId = await createOrder(w.service.url);
      w.path.script('/psp/charges', [{ kind: 'lose' }, { kind: 'answer', status: 422 }]);
      const res = await pay(w.service.url, orderId, randomUUID());
      // Before: 402 payment-declined provider_refused at once, though the first attempt might have been charged.
      expect(res.status).toBe(503);
      expect(res.body.type).toBe(PROBLEM('payment-pending'));
      const paymentId = res.body.paymentId as string;
      expect((await paymentOf(paymentId)).status).toBe('pending');
      const decided = await until('the payment to be decided', async () => {
        const p = await paymentOf(paymentId);
        return p.status !== 'pending' ? p : undefined;
      });
      expect(decided).toMatchObject({ status: 'failed', failure_code: 'provider_unreachable' });
      expect(Number(decided.decided_after_ms)).toBeGreaterThanOrEqual(MAX_LATENCY_MS);
      expect(await providerMoney(w.sandbox.url, orderId)).toEqual({ net: 0, charges: 0 });
    },
    PROCESS_TEST_TIMEOUT_MS,
  );

  it(
    'a refund: a timeout, then a 422: pending with its amount still reserved until the window closes, then failed by lookups and given back',
    async () => {
      const orderId = await createOrder(w.service.url);
      const paid = await pay(w.service.url, orderId, randomUUID());
      expect(paid.status).toBe(201);
      expect((await request(w.service.url).post(`/orders/${orderId}/cancel`).set('Authorization', bearer(ALICE))).status).toBe(200);
      w.path.script('/psp/refunds', [{ kind: 'lose' }, { kind: 'answer', status: 422 }]);
      const res = await request(w.service.url)
        .post(`/payments/${paid.body.id}/refunds`)
        .set('Authorization', bearer(ALICE))
        .set('Idempotency-Key', randomUUID())
        .send({});
      expect(res.status).toBe(503);
      expect(res.body.type).toBe(PROBLEM('refund-pending'));
      const refundOf = async () =>
        (
          await w.db.query(
            `SELECT r.status, r.failure_code, p.refunded_minor::int AS reserved, extract(epoch FROM r.updated_at - a.last_attempt_by) * 1000 AS decided_after_ms
             FROM refunds r JOIN payments p ON p.id = r.payment_id JOIN provider_attempts a ON a.subject_id = r.id WHERE r.id = $1`,
            [res.body.refundId],
          )
        ).rows[0];
      expect(await refundOf()).toMatchObject({ status: 'pending', reserved: ORDER_TOTAL });
      const decided = await until('the refund to be decided', async () => {
        const r = await refundOf();
        return r.status !== 'pending' ? r : undefined;
      });
      expect(decided).toMatchObject({ status: 'failed', failure_code: 'provider_unreachable', reserved: 0 });
      expect(Number(decided.decided_after_ms)).toBeGreaterThanOrEqual(MAX_LATENCY_MS);
      expect(await providerMoney(w.sandbox.url, orderId)).toEqual({ net: ORDER_TOTAL, charges: 1 });
      expect(await booksNet(w, orderId)).toBe(ORDER_TOTAL);
    },
    PROCESS_TEST_TIMEOUT_MS,
  );

  it(
    'a timeout whose attempt lands late, then a 422 on the retry: pending, then the lookups find the charge and the order is paid once',
    async () => {
      const orderId = await createOrder(w.service.url);
      w.path.script('/psp/charges', [
        { kind: 'late', delayMs: 1_500 },
        { kind: 'answer', status: 422 },
      ]);
      const res = await pay(w.service.url, orderId, randomUUID());
      expect(res.status).toBe(503);
      const paymentId = res.body.paymentId as string;
      const decided = await until('the payment to be decided', async () => {
        const p = await paymentOf(paymentId);
        return p.status !== 'pending' ? p : undefined;
      });
      await w.path.settled();
      const money = await providerMoney(w.sandbox.url, orderId);
      expect(money).toEqual({ net: ORDER_TOTAL, charges: 1 });
      expect(decided.status).toBe('succeeded');
      expect(await booksNet(w, orderId)).toBe(ORDER_TOTAL);
      const { rows } = await w.db.query(`SELECT count(*)::int AS n FROM late_charge_refunds WHERE payment_id = $1`, [paymentId]);
      expect(rows[0].n).toBe(0);
    },
    PROCESS_TEST_TIMEOUT_MS,
  );
});
