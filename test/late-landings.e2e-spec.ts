import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { LatePath } from './support/late-path';
import { providerMoney } from './support/provider-ledger';
import { SANDBOX_MAIN, type ServiceProcess, startServiceProcess } from './support/service-process';
import { ALICE, bearer, startTestApp, type TestApp, WEBHOOK_SECRET } from './support/test-app';

/**
 * A provider request that lands after the service gave up on it. The service calls the sandbox provider as
 * its own process (`npm run psp`) through a slow path (LatePath) that delivers every attempt of the first
 * charge (or refund) it sees LATE_MS late, while the client's attempts time out after PSP_TIMEOUT_MS. After
 * each scenario, once everything has settled, the provider's ledger must say what the books say: the money
 * at the provider (succeeded charges − succeeded refunds) is what the order's payments and refunds book.
 */
const LATE_MS = 4_000;
const ORDER_TOTAL = 1_500;
const SETTLE_DEADLINE_MS = 40_000;
const PROBLEM = (name: string) => `urn:idempotent-orders:problem:${name}`;

interface World {
  t: TestApp;
  sandbox: ServiceProcess;
  path: LatePath;
  close(): Promise<void>;
}

async function startWorld({
  webhooks,
  reconciler,
  maxLatencyMs,
}: {
  webhooks: boolean;
  reconciler: boolean;
  maxLatencyMs: number;
}): Promise<World> {
  const path = new LatePath();
  const pathUrl = await path.start();
  let t: TestApp | undefined;
  let sandbox: ServiceProcess | undefined;
  const close = async () => {
    await sandbox?.kill('SIGTERM');
    await path.stop();
    await t?.close();
  };
  try {
    t = await startTestApp({
      PSP_BASE_URL: `${pathUrl}/psp`,
      PSP_TIMEOUT_MS: '300',
      PSP_MAX_ATTEMPTS: '3',
      IDEMPOTENCY_LEASE_SECONDS: '5',
      RECONCILE_INTERVAL_MS: reconciler ? '500' : '0',
      PSP_MAX_LATENCY_MS: String(maxLatencyMs),
      // The held attempts fail every call of a scenario; the breaker must not turn the next scenario away.
      PSP_BREAKER_THRESHOLD: '1000',
    });
    sandbox = await startServiceProcess(
      {
        DATABASE_URL: t.databaseUrl,
        PSP_PORT: '0',
        PSP_TIMEOUT_MS: '300',
        PSP_WEBHOOK_URL: webhooks ? `${t.url}/webhooks/psp` : 'none',
        PSP_WEBHOOK_SECRET: WEBHOOK_SECRET,
      },
      { main: SANDBOX_MAIN },
    );
    path.target = sandbox.url;
    return { t, sandbox, path, close };
  } catch (err) {
    await close();
    throw err;
  }
}

async function createOrder(w: World): Promise<string> {
  const res = await request(w.t.url)
    .post('/orders')
    .set('Authorization', bearer(ALICE))
    .set('Idempotency-Key', randomUUID())
    .send({ currency: 'EUR', items: [{ sku: 'LATE-1', quantity: 1, unitPriceMinor: ORDER_TOTAL }] });
  expect(res.status).toBe(201);
  return res.body.id as string;
}

const pay = (w: World, orderId: string, key: string) =>
  request(w.t.url)
    .post(`/orders/${orderId}/payments`)
    .set('Authorization', bearer(ALICE))
    .set('Idempotency-Key', key)
    .send({ source: 'tok_visa' });
const refund = (w: World, paymentId: string, key: string) =>
  request(w.t.url).post(`/payments/${paymentId}/refunds`).set('Authorization', bearer(ALICE)).set('Idempotency-Key', key).send({});
const cancel = (w: World, orderId: string) => request(w.t.url).post(`/orders/${orderId}/cancel`).set('Authorization', bearer(ALICE));

/** A client that keeps asking while told to come back (503, or a 409 with Retry-After), as Retry-After says, until a final answer. */
async function untilFinal(send: () => request.Test): Promise<request.Response> {
  const deadline = Date.now() + SETTLE_DEADLINE_MS;
  for (;;) {
    const res = await send();
    const comeBack = res.status === 503 || (res.status === 409 && res.headers['retry-after'] !== undefined);
    if (!comeBack) return res;
    if (Date.now() > deadline) throw new Error(`still ${res.status} ${res.text}`);
    await new Promise((r) => setTimeout(r, Number(res.headers['retry-after'] ?? 1) * 1000));
  }
}

/** Polls until `check` returns a value, or fails after the deadline naming `what`. */
async function until<T>(what: string, check: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + SETTLE_DEADLINE_MS;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** Everything about the order is decided: every held request landed, nothing pending in our books. */
async function settled(w: World, orderId: string): Promise<void> {
  await w.path.landed();
  await until('every payment, refund and late-charge refund of the order to settle', async () => {
    const { rows } = await w.t.db.query(
      `SELECT (SELECT count(*) FROM payments WHERE order_id = $1 AND status = 'pending')
            + (SELECT count(*) FROM refunds r JOIN payments p ON p.id = r.payment_id WHERE p.order_id = $1 AND r.status = 'pending')
            + (SELECT count(*) FROM late_charge_refunds l JOIN payments p ON p.id = l.payment_id WHERE p.order_id = $1 AND l.status = 'pending') AS pending`,
      [orderId],
    );
    return Number(rows[0].pending) === 0 ? true : undefined;
  });
}

/** What our books say the customer paid for the order, net of refunds, and the order's status. */
async function books(w: World, orderId: string): Promise<{ net: number; status: string; paidEvents: number }> {
  const { rows } = await w.t.db.query(
    `SELECT o.status,
            (SELECT coalesce(sum(amount_minor), 0) FROM payments WHERE order_id = o.id AND status = 'succeeded')
          - (SELECT coalesce(sum(r.amount_minor), 0) FROM refunds r JOIN payments p ON p.id = r.payment_id WHERE p.order_id = o.id AND r.status = 'succeeded') AS net,
            (SELECT count(*)::int FROM order_events WHERE order_id = o.id AND to_status = 'paid') AS paid_events
       FROM orders o WHERE o.id = $1`,
    [orderId],
  );
  return { net: Number(rows[0].net), status: rows[0].status, paidEvents: rows[0].paid_events };
}

/** The invariant, once the order has settled: the provider holds exactly what the books say, paid once or not at all. */
async function expectLedgerMatchesBooks(w: World, orderId: string): Promise<{ net: number; status: string }> {
  await settled(w, orderId);
  const money = await providerMoney(w.sandbox.url, orderId);
  const ours = await books(w, orderId);
  expect(money.net).toBe(ours.net);
  expect([0, ORDER_TOTAL]).toContain(ours.net);
  expect(ours.paidEvents).toBeLessThanOrEqual(1);
  return ours;
}

/** Pays an order through the slow path: every attempt of its first charge lands late, so the request answers 503 pending. */
async function payLate(w: World, orderId: string): Promise<{ key: string; paymentId: string }> {
  w.path.delayFirstKey('/psp/charges', LATE_MS);
  const key = randomUUID();
  const res = await pay(w, orderId, key);
  expect(res.status).toBe(503);
  expect(res.body.type).toBe(PROBLEM('payment-pending'));
  return { key, paymentId: res.body.paymentId as string };
}

/** A paid, cancelled order and a refund whose every attempt lands late (503 refund-pending). */
async function refundLate(w: World): Promise<{ orderId: string; paymentId: string; key: string }> {
  const orderId = await createOrder(w);
  const paid = await pay(w, orderId, randomUUID());
  expect(paid.status).toBe(201);
  expect((await cancel(w, orderId)).status).toBe(200);
  w.path.delayFirstKey('/psp/refunds', LATE_MS);
  const key = randomUUID();
  const res = await refund(w, paid.body.id, key);
  expect(res.status).toBe(503);
  expect(res.body.type).toBe(PROBLEM('refund-pending'));
  return { orderId, paymentId: paid.body.id as string, key };
}

async function metric(w: World, line: RegExp): Promise<number> {
  const text = (await request(w.t.url).get('/metrics')).text;
  const found = text.split('\n').find((l) => line.test(l));
  return found ? Number(found.split(' ').pop()) : 0;
}

describe.each([
  { webhooks: false, reconciler: true },
  { webhooks: false, reconciler: false },
  { webhooks: true, reconciler: false },
])(
  'a charge or refund that lands late, within PSP_MAX_LATENCY_MS (webhooks $webhooks, reconciler $reconciler)',
  ({ webhooks, reconciler }) => {
    let w: World;
    beforeAll(async () => {
      w = await startWorld({ webhooks, reconciler, maxLatencyMs: LATE_MS + 2_000 });
    });
    afterAll(async () => {
      await w?.close();
    });

    it('pay with K1 → 503, at once again with K2: K2 is told to wait, never charged; the late charge pays the order once', async () => {
      const orderId = await createOrder(w);
      const first = await payLate(w, orderId);
      const second = await pay(w, orderId, randomUUID());
      // The old answer was 201 with a second charge: the first was declared never reached while still on its way.
      expect(second.status).toBe(409);
      expect(second.body).toMatchObject({ type: PROBLEM('payment-in-progress'), paymentId: first.paymentId });
      const final = await untilFinal(() => pay(w, orderId, randomUUID()));
      expect(final.status).toBe(409);
      expect(final.body).toMatchObject({ type: PROBLEM('order-not-payable'), currentStatus: 'paid' });
      expect(await expectLedgerMatchesBooks(w, orderId)).toEqual({ net: ORDER_TOTAL, status: 'paid', paidEvents: 1 });
      expect((await providerMoney(w.sandbox.url, orderId)).charges).toBe(1);
    });

    it('pay with K1 → 503, then (only) the settling the service does itself: the late charge is booked, the order paid', async () => {
      const orderId = await createOrder(w);
      const first = await payLate(w, orderId);
      // With neither reconciler nor webhooks, only the client's own retry can settle it: it resumes under the same outbound key.
      if (!reconciler && !webhooks) expect((await untilFinal(() => pay(w, orderId, first.key))).status).toBe(201);
      expect(await expectLedgerMatchesBooks(w, orderId)).toEqual({ net: ORDER_TOTAL, status: 'paid', paidEvents: 1 });
      const replay = await pay(w, orderId, first.key);
      expect(replay.status).toBe(201);
      expect(replay.body).toMatchObject({ id: first.paymentId, status: 'succeeded' });
    });

    it("a cancelled order's refund → 503, then nothing more from the client: the late refund is booked and the order refunded", async () => {
      const { orderId, paymentId, key } = await refundLate(w);
      if (!reconciler && !webhooks) expect((await untilFinal(() => refund(w, paymentId, key))).status).toBe(201);
      expect(await expectLedgerMatchesBooks(w, orderId)).toMatchObject({ net: 0, status: 'refunded' });
      const { rows } = await w.t.db.query(`SELECT refunded_minor FROM payments WHERE id = $1`, [paymentId]);
      expect(Number(rows[0].refunded_minor)).toBe(ORDER_TOTAL);
    });
  },
);

describe.each([
  { webhooks: false, reconciler: true },
  { webhooks: true, reconciler: true },
])('money that lands after every bound (PSP_MAX_LATENCY_MS shorter than the delay; webhooks $webhooks)', ({ webhooks, reconciler }) => {
  let w: World;
  beforeAll(async () => {
    w = await startWorld({ webhooks, reconciler, maxLatencyMs: 200 });
  });
  afterAll(async () => {
    await w?.close();
  });

  /** Makes the sweep's next look due now, instead of a minute after the row was failed. */
  const recheckNow = async (id: string) => {
    // Failing it as never reached put it on the sweep's list; only the minute's wait is skipped here.
    const { rowCount } = await w.t.db.query(
      `UPDATE provider_attempts SET recheck_at = now() WHERE subject_id = $1 AND recheck_at IS NOT NULL`,
      [id],
    );
    expect(rowCount).toBe(1);
  };

  it('a payment failed as never reached whose charge lands later: the charge is refunded, the second key keeps its one payment', async () => {
    const orderId = await createOrder(w);
    const first = await payLate(w, orderId);
    const before = await metric(w, /^payments_late_landings_total\{kind="charge"/);
    // Past the bound the service must decide, and it decides wrongly here (the provider broke its promise): K2 pays.
    const second = await untilFinal(() => pay(w, orderId, randomUUID()));
    expect(second.status).toBe(201);
    await until('the first payment to be failed as never reached', async () => {
      const { rows } = await w.t.db.query(`SELECT failure_code FROM payments WHERE id = $1 AND status = 'failed'`, [first.paymentId]);
      return rows[0]?.failure_code === 'provider_unreachable' ? true : undefined;
    });
    await w.path.landed();
    if (!webhooks) {
      // No webhook will tell: the sweep must find it.
      await recheckNow(first.paymentId);
    }
    await until('the late charge to be refunded', async () => {
      const { rows } = await w.t.db.query(`SELECT status FROM late_charge_refunds WHERE payment_id = $1`, [first.paymentId]);
      return rows[0]?.status === 'succeeded' ? true : undefined;
    });
    expect(await expectLedgerMatchesBooks(w, orderId)).toEqual({ net: ORDER_TOTAL, status: 'paid', paidEvents: 1 });
    expect((await providerMoney(w.sandbox.url, orderId)).charges).toBe(2);
    expect(
      await metric(w, new RegExp(`^payments_late_landings_total\\{kind="charge",found_by="${webhooks ? 'webhook' : 'sweep'}"\\}`)),
    ).toBeGreaterThan(before);
  });

  it('a refund failed as never reached that lands later: applied to refundedMinor, the order refunded', async () => {
    const { orderId, paymentId } = await refundLate(w);
    const [failed] = await until('the refund to be failed as never reached', async () => {
      const { rows } = await w.t.db.query(`SELECT id, failure_code FROM refunds WHERE payment_id = $1 AND status = 'failed'`, [paymentId]);
      return rows.length ? rows : undefined;
    });
    expect(failed.failure_code).toBe('provider_unreachable');
    await w.path.landed();
    if (!webhooks) await recheckNow(failed.id);
    await until('the late refund to be applied', async () => {
      const { rows } = await w.t.db.query(`SELECT status FROM refunds WHERE id = $1`, [failed.id]);
      return rows[0].status === 'succeeded' ? true : undefined;
    });
    expect(await expectLedgerMatchesBooks(w, orderId)).toMatchObject({ net: 0, status: 'refunded' });
    const { rows } = await w.t.db.query(`SELECT refunded_minor FROM payments WHERE id = $1`, [paymentId]);
    expect(Number(rows[0].refunded_minor)).toBe(ORDER_TOTAL);
    expect(await metric(w, /^payments_late_landings_total\{kind="refund"/)).toBeGreaterThanOrEqual(1);
  });
});
