import { setTimeout as sleep } from 'node:timers/promises';
import { Pool } from 'pg';
import request from 'supertest';
import { LatePath } from './support/late-path';
import { SANDBOX_MAIN, startServiceProcess, type ServiceProcess } from './support/service-process';
import { ALICE, bearer, createTestDatabase, WEBHOOK_SECRET } from './support/test-app';

/** Three service starts plus the storm and the reconcilers' catch-up, on a loaded 2-core machine. */
const PROCESS_TEST_TIMEOUT_MS = 240_000;
/** How long one client keeps retrying a temporary answer (409/503 + Retry-After) before the test fails. */
const CLIENT_RETRY_DEADLINE_MS = 60_000;
/** How long the test waits for every payment, refund and key to be settled once the storm is over. */
const SETTLE_DEADLINE_MS = 60_000;
/** Fixed, so a failure replays the same workload (the interleavings still vary with the machine). */
const SEED = 0x15_3_3;
const ORDERS = 24;
const PAY_SOURCES = ['tok_visa', 'tok_flaky', 'tok_timeout', 'tok_lost', 'tok_chargeDeclined', 'tok_unavailable'] as const;
/** Every fourth charge key (and every fifth refund key) reaches the provider this late, all its attempts. */
const LATE_MS = 2_000;

/** mulberry32: a tiny seeded PRNG, so the workload is the same on every run. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

interface Seen {
  instance: number;
  method: string;
  path: string;
  status: number;
  retryAfter?: string;
  body: string;
}

/**
 * Three instances of the built service on one database, as a scaled-out deployment runs them:
 * a mixed storm of creates, pays, cancels and refunds, each key sent to several instances at
 * once, with provider faults, while the three reconcilers compete for the same unfinished keys.
 * Afterwards the database and the sandbox ledger must show every invariant in docs/contract.md#invariants.
 */
describe('three service processes on one database: a mixed storm keeps every invariant', () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let db: Pool;
  const instances: ServiceProcess[] = [];
  // One provider for the three, as a deployment has: the sandbox as its own process, behind a slow path.
  const path = new LatePath();
  let sandbox: ServiceProcess | undefined;

  beforeAll(async () => {
    database = await createTestDatabase();
    db = new Pool({ connectionString: database.url, max: 2 });
    db.on('error', () => undefined);
    const pathUrl = await path.start();
    const env = {
      DATABASE_URL: database.url,
      API_KEYS: `${ALICE.clientId}:${ALICE.secret}`,
      PSP_BASE_URL: `${pathUrl}/psp`,
      PSP_WEBHOOK_SECRET: WEBHOOK_SECRET,
      // Requests the slow path holds land within this: nobody may decide they never arrived before.
      PSP_MAX_LATENCY_MS: String(LATE_MS + 1_500),
      // Short provider timeouts and leases so tok_timeout/tok_lost/tok_unavailable end in 503 payment-pending
      // and the reconcilers (every 500 ms, on all three) take the unfinished keys over within the test.
      PSP_TIMEOUT_MS: '300',
      PSP_MAX_ATTEMPTS: '3',
      IDEMPOTENCY_LEASE_SECONDS: '4',
      RECONCILE_INTERVAL_MS: '500',
      // The faulty tokens open the paying client's breaker on each instance; a short half-open keeps Retry-After (and the test) short.
      PSP_BREAKER_HALF_OPEN_MS: '2000',
    };
    // One at a time: three concurrent migration runs would only queue on the advisory lock anyway.
    for (let i = 0; i < 3; i++) instances.push(await startServiceProcess(env));
    sandbox = await startServiceProcess(
      {
        DATABASE_URL: database.url,
        PSP_PORT: '0',
        PSP_TIMEOUT_MS: env.PSP_TIMEOUT_MS,
        PSP_WEBHOOK_URL: `${instances[0].url}/webhooks/psp`,
        PSP_WEBHOOK_SECRET: WEBHOOK_SECRET,
      },
      { main: SANDBOX_MAIN },
    );
    path.target = sandbox.url;
    path.delayKeys('/psp/charges', LATE_MS, (n) => n % 4 === 1);
    path.delayKeys('/psp/refunds', LATE_MS, (n) => n % 5 === 2);
  }, PROCESS_TEST_TIMEOUT_MS);

  afterAll(async () => {
    await Promise.all(instances.map((p) => p.kill('SIGKILL')));
    await sandbox?.kill('SIGKILL');
    await path.stop();
    await db?.end();
    await database?.drop();
  });

  const seen: Seen[] = [];

  async function send(instance: number, method: 'POST', path: string, body: object, key?: string): Promise<request.Response> {
    let req = request(instances[instance].url).post(path).set('Authorization', bearer(ALICE));
    if (key) req = req.set('Idempotency-Key', key);
    const res = await req.send(body);
    seen.push({ instance, method, path, status: res.status, retryAfter: res.headers['retry-after'], body: res.text });
    return res;
  }

  /** A well-behaved client: retries a temporary refusal (409 or 503 carrying Retry-After) after that long, bounded. */
  async function untilFinal(instance: number, path: string, body: object, key?: string): Promise<request.Response> {
    const deadline = Date.now() + CLIENT_RETRY_DEADLINE_MS;
    for (;;) {
      const res = await send(instance, 'POST', path, body, key);
      const retryAfter = res.headers['retry-after'] as string | undefined;
      if (!((res.status === 409 || res.status === 503) && retryAfter !== undefined)) return res;
      if (Date.now() > deadline) throw new Error(`POST ${path} (key ${key}) still answers ${res.status} ${res.text}`);
      await sleep(Number(retryAfter) * 1000);
    }
  }

  it(
    'creates, pays, cancels and refunds split across three instances: one order per key and number, one charge per order, refunds within the amount, nothing left pending',
    async () => {
      const random = prng(SEED);
      const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)];
      const between = (lo: number, hi: number) => lo + Math.floor(random() * (hi - lo + 1));

      // --- Creates: every key sent 1–3 times to different instances at once; some order numbers
      // also created again under a new key with the same content (the natural key answers 200).
      const orders = Array.from({ length: ORDERS }, (_, i) => ({
        orderNumber: `PO-3I-${i}`,
        body: {
          orderNumber: `PO-3I-${i}`,
          currency: 'EUR',
          items: [{ sku: `SKU-${i}`, quantity: between(1, 3), unitPriceMinor: between(500, 2500) }],
        },
        keys: [`create-${i}`, ...(random() < 0.3 ? [`create-${i}-again`] : [])],
        copies: between(1, 3),
      }));
      const createAnswers = await Promise.all(
        orders.flatMap((order, i) =>
          order.keys.flatMap((key) =>
            Array.from({ length: order.copies }, (_, copy) =>
              untilFinal((i + copy) % 3, '/orders', order.body, key).then((res) => ({ order, key, res })),
            ),
          ),
        ),
      );
      const orderIdByNumber = new Map<string, string>();
      const orderIdByKey = new Map<string, string>();
      const totalById = new Map<string, number>();
      for (const { order, key, res } of createAnswers) {
        expect([200, 201]).toContain(res.status);
        const id = res.body.id as string;
        expect(orderIdByNumber.get(order.orderNumber) ?? id).toBe(id);
        expect(orderIdByKey.get(key) ?? id).toBe(id);
        orderIdByNumber.set(order.orderNumber, id);
        orderIdByKey.set(key, id);
        totalById.set(id, Number(res.body.totalMinor));
      }
      expect(orderIdByNumber.size).toBe(ORDERS);

      // --- Pays, cancels, refunds: every order's scenario runs at once with all the others.
      const payKeyAnswers = new Map<string, request.Response[]>();
      const refundedByOrder = new Map<string, number>();

      async function payWithKey(orderId: string, source: string, key: string, copies: number, first: number): Promise<request.Response> {
        const answers = await Promise.all(
          Array.from({ length: copies }, (_, c) => untilFinal((first + c) % 3, `/orders/${orderId}/payments`, { source }, key)),
        );
        payKeyAnswers.set(key, answers);
        return answers[0];
      }

      async function cancel(orderId: string, copies: number, first: number): Promise<request.Response[]> {
        return Promise.all(
          Array.from({ length: copies }, (_, c) => untilFinal((first + c) % 3, `/orders/${orderId}/cancel`, {}, `cancel-${orderId}`)),
        );
      }

      const scenarios = orders.map((order, i) => {
        const orderId = orderIdByNumber.get(order.orderNumber)!;
        const total = totalById.get(orderId)!;
        const kind = random();
        const source = pick(PAY_SOURCES);
        const copies = between(1, 3);
        const retryWithVisa = random() < 0.5;
        const refund = random() < 0.7;
        const refundAmounts = Array.from({ length: between(2, 4) }, () => Math.max(1, Math.round(total * (0.2 + random() * 0.3))));
        const duplicateRefund = random() < 0.5;
        const rival = random() < 0.25;
        return async () => {
          if (kind < 0.15) {
            // Cancel a created order, the same key sent to two instances.
            for (const res of await cancel(orderId, 2, i)) expect(res.status).toBe(200);
            return;
          }
          if (kind < 0.25) {
            // Pay and cancel at once: either may win, neither may break the other.
            await Promise.all([payWithKey(orderId, pick(['tok_visa', 'tok_lost']), `pay-${i}`, copies, i), cancel(orderId, 1, i + 1)]);
            return;
          }
          // Some orders are also paid under a second key at once (a double click that made a new key):
          // one active payment per order, across instances.
          const answers = await Promise.all([
            payWithKey(orderId, source, `pay-${i}`, copies, i),
            ...(rival ? [payWithKey(orderId, 'tok_visa', `pay-${i}-rival`, 1, i + 2)] : []),
          ]);
          let paid = answers.find((res) => res.status === 201) ?? answers[0];
          if (paid.status === 402 && retryWithVisa) paid = await payWithKey(orderId, 'tok_visa', `pay-${i}-visa`, copies, i + 1);
          if (paid.status !== 201 || !refund) return;
          // Cancel the paid order on two instances, then partial refunds in parallel across all three.
          for (const res of await cancel(orderId, 2, i)) expect(res.status).toBe(200);
          const paymentId = paid.body.id as string;
          const refunds = await Promise.all(
            refundAmounts.flatMap((amountMinor, r) =>
              Array.from({ length: duplicateRefund && r === 0 ? 2 : 1 }, (_, c) =>
                untilFinal((i + r + c) % 3, `/payments/${paymentId}/refunds`, { amountMinor }, `refund-${i}-${r}`).then((res) => ({
                  r,
                  amountMinor,
                  res,
                })),
              ),
            ),
          );
          let refunded = 0;
          const counted = new Set<number>();
          for (const { r, amountMinor, res } of refunds) {
            expect([201, 402, 422]).toContain(res.status);
            if (res.status === 201 && !counted.has(r)) {
              counted.add(r);
              refunded += amountMinor;
            }
          }
          expect(refunded).toBeLessThanOrEqual(total);
          refundedByOrder.set(orderId, refunded);
        };
      });
      await Promise.all(scenarios.map((run) => run()));

      // Every copy of one pay key got the same final answer: one payment, however many instances it reached.
      for (const [key, answers] of payKeyAnswers) {
        const final = answers.map((res) => ({ status: res.status, paymentId: (res.body.id ?? res.body.paymentId) as string | undefined }));
        expect({ key, final }).toEqual({ key, final: answers.map(() => final[0]) });
      }

      // --- Quiet: every held request has landed, and the reconcilers and webhooks have settled everything the storm left unfinished.
      await path.landed();
      const deadline = Date.now() + SETTLE_DEADLINE_MS;
      let unsettled: Record<string, number>;
      for (;;) {
        const { rows } = await db.query<{ payments: number; refunds: number; keys: number }>(
          `SELECT (SELECT count(*)::int FROM payments WHERE status = 'pending') AS payments,
                (SELECT count(*)::int FROM refunds WHERE status = 'pending') AS refunds,
                (SELECT count(*)::int FROM idempotency_keys WHERE state = 'in_progress') AS keys`,
        );
        unsettled = rows[0];
        if (unsettled.payments === 0 && unsettled.refunds === 0 && unsettled.keys === 0) break;
        if (Date.now() > deadline) break;
        await sleep(200);
      }
      expect(unsettled).toEqual({ payments: 0, refunds: 0, keys: 0 });

      // No 5xx anywhere, except the designed temporary 503s that carry Retry-After (payment-pending and the like).
      const broken = seen.filter((s) => s.status >= 500 && !(s.status === 503 && s.retryAfter !== undefined));
      expect(broken).toEqual([]);
      const unexpected = seen.filter((s) => ![200, 201, 402, 409, 422, 503].includes(s.status));
      expect(unexpected).toEqual([]);

      // One order per (client, order_number), and per create key (the key's stored answer names it).
      const { rows: orderRows } = await db.query<{ id: string; order_number: string }>(`SELECT id, order_number FROM orders`);
      expect(orderRows).toHaveLength(ORDERS);
      expect(new Map(orderRows.map((o) => [o.order_number, o.id]))).toEqual(orderIdByNumber);
      const { rows: createKeys } = await db.query<{ key: string; response_body: string }>(
        `SELECT key, response_body FROM idempotency_keys WHERE request_method = 'POST' AND request_path = '/orders'`,
      );
      expect(new Map(createKeys.map((k) => [k.key, JSON.parse(k.response_body).id as string]))).toEqual(orderIdByKey);

      // Per order: at most one succeeded payment, and a succeeded payment exactly when there is a paid history row.
      const { rows: perOrder } = await db.query<{
        id: string;
        status: string;
        succeeded: number;
        paid_events: number;
        cancelled_events: number;
        refunded_events: number;
      }>(
        `SELECT o.id, o.status,
              (SELECT count(*)::int FROM payments p WHERE p.order_id = o.id AND p.status = 'succeeded') AS succeeded,
              (SELECT count(*)::int FROM order_events e WHERE e.order_id = o.id AND e.to_status = 'paid') AS paid_events,
              (SELECT count(*)::int FROM order_events e WHERE e.order_id = o.id AND e.to_status = 'cancelled') AS cancelled_events,
              (SELECT count(*)::int FROM order_events e WHERE e.order_id = o.id AND e.to_status = 'refunded') AS refunded_events
         FROM orders o`,
      );
      for (const o of perOrder) {
        expect(o.succeeded).toBeLessThanOrEqual(1);
        expect({ id: o.id, paidEvents: o.paid_events }).toEqual({ id: o.id, paidEvents: o.succeeded });
        expect(o.cancelled_events).toBeLessThanOrEqual(1);
        expect(o.refunded_events).toBeLessThanOrEqual(1);
        expect({ id: o.id, status: o.status }).toEqual({
          id: o.id,
          status: o.succeeded === 1 ? expect.stringMatching(/^(paid|cancelled|refunded)$/) : expect.stringMatching(/^(created|cancelled)$/),
        });
      }

      // The provider's ledger: at most one succeeded charge per order, and the succeeded charges are exactly
      // the charges of our succeeded payments (same charge id, same payment, same amount).
      const { rows: doubleCharged } = await db.query(
        `SELECT order_id, count(*)::int AS n FROM psp.charges WHERE status = 'succeeded' GROUP BY order_id HAVING count(*) > 1`,
      );
      expect(doubleCharged).toEqual([]);
      const { rows: chargeMismatch } = await db.query(
        `SELECT p.id AS payment_id, p.status AS payment_status, c.id AS charge_id, c.status AS charge_status
         FROM payments p
         FULL JOIN (SELECT * FROM psp.charges WHERE status = 'succeeded') c
           ON c.payment_id = p.id AND c.id = p.provider_transaction_id AND c.amount_minor = p.amount_minor AND c.order_id = p.order_id
        WHERE (p.status = 'succeeded') IS DISTINCT FROM (c.id IS NOT NULL)`,
      );
      expect(chargeMismatch).toEqual([]);

      // Refunds: never over the amount; the reservation equals what settled; the order is refunded exactly
      // when the refunds reach the amount; the provider's succeeded refunds are exactly ours.
      const { rows: perPayment } = await db.query<{
        id: string;
        order_id: string;
        order_status: string;
        amount: string;
        refunded: string;
        succeeded_sum: string;
        ledger_sum: string;
      }>(
        `SELECT p.id, p.order_id, o.status AS order_status, p.amount_minor AS amount, p.refunded_minor AS refunded,
              (SELECT coalesce(sum(r.amount_minor), 0) FROM refunds r WHERE r.payment_id = p.id AND r.status = 'succeeded') AS succeeded_sum,
              (SELECT coalesce(sum(pr.amount_minor), 0) FROM psp.refunds pr WHERE pr.payment_id = p.id AND pr.status = 'succeeded') AS ledger_sum
         FROM payments p JOIN orders o ON o.id = p.order_id WHERE p.status = 'succeeded'`,
      );
      for (const p of perPayment) {
        const [amount, refunded, succeeded, ledger] = [p.amount, p.refunded, p.succeeded_sum, p.ledger_sum].map(Number);
        expect(succeeded).toBeLessThanOrEqual(amount);
        expect({ id: p.id, refunded, ledger }).toEqual({ id: p.id, refunded: succeeded, ledger: succeeded });
        expect({ id: p.id, refundedOrder: p.order_status === 'refunded' }).toEqual({ id: p.id, refundedOrder: succeeded === amount });
        // What the clients were told (201s) is what settled: a 503 a client gave up on never happens here.
        if (refundedByOrder.has(p.order_id))
          expect({ id: p.id, settled: succeeded }).toEqual({ id: p.id, settled: refundedByOrder.get(p.order_id) });
      }
      const { rows: refundMismatch } = await db.query(
        `SELECT r.id, r.status, pr.id AS provider_refund
         FROM refunds r FULL JOIN (SELECT * FROM psp.refunds WHERE status = 'succeeded') pr
           ON pr.refund_id = r.id AND pr.id = r.provider_refund_id AND pr.amount_minor = r.amount_minor
        WHERE (r.status = 'succeeded') IS DISTINCT FROM (pr.id IS NOT NULL)`,
      );
      expect(refundMismatch).toEqual([]);

      // The storm exercised what it claims to: repeats, faults, settled payments, refunds and cancels.
      const { rows: mix } = await db.query<Record<string, number>>(
        `SELECT (SELECT count(*)::int FROM payments WHERE status = 'succeeded') AS succeeded,
              (SELECT count(*)::int FROM payments WHERE status = 'failed') AS failed,
              (SELECT count(*)::int FROM refunds WHERE status = 'succeeded') AS refunds,
              (SELECT count(*)::int FROM orders WHERE status = 'cancelled') AS cancelled`,
      );
      for (const n of Object.values(mix[0])) expect(n).toBeGreaterThan(0);
      expect(seen.some((s) => s.status === 503)).toBe(true);
      expect(path.held.filter((h) => h.clientWaited === false).length).toBeGreaterThan(0);
      expect(seen.length).toBeGreaterThan(120);
    },
    PROCESS_TEST_TIMEOUT_MS,
  );
});
