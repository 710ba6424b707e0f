import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { AtomicPhases } from '@idempotent-orders/idempotency';
import { PaymentReconciler } from '../src/payments/payment-reconciler';
import { PaymentSettlement } from '../src/payments/payment-settlement';
import { ALICE, BOB, bearer, PSP_AUTH, startTestApp, type TestApp } from './support/test-app';

const PROBLEM_JSON = /^application\/problem\+json/;

/**
 * Payments and refunds against the in-process sandbox provider, over real HTTP. Each test checks
 * our database AND the provider's ledger (GET /psp/charges): exactly one charge, whatever happened.
 */
describe('payments: exactly one charge across retries, races, timeouts and lost answers', () => {
  let t: TestApp;
  let numbers = 0;

  beforeAll(async () => {
    t = await startTestApp({
      // Short provider timeouts keep the fault tokens fast (tok_timeout / tok_lost answer after 3 × this), yet
      // long enough that tok_visa rarely times out on a loaded machine (the concurrency tests retry 503s anyway).
      PSP_TIMEOUT_MS: '500',
      PSP_MAX_ATTEMPTS: '3',
      IDEMPOTENCY_LEASE_SECONDS: '5',
      // The tests run the reconciler themselves, when they want it; the sandbox's webhooks, which would
      // settle pending payments too, have their own tests (payments-webhooks.e2e-spec.ts).
      RECONCILE_INTERVAL_MS: '0',
      PSP_WEBHOOK_URL: 'none',
      // The fault tokens' unknown outcomes follow one another here; the breaker has its own test below.
      PSP_BREAKER_THRESHOLD: '50',
    });
  });
  afterAll(async () => {
    await t?.close();
  });

  async function createOrder(totalMinor = 2500, client = ALICE): Promise<string> {
    const res = await request(t.url)
      .post('/orders')
      .set('Authorization', bearer(client))
      .set('Idempotency-Key', randomUUID())
      .send({ orderNumber: `PAY-${++numbers}`, currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: totalMinor }] });
    expect(res.status).toBe(201);
    return res.body.id as string;
  }

  const pay = (orderId: string, source: string, key: string = randomUUID(), client = ALICE) =>
    request(t.url).post(`/orders/${orderId}/payments`).set('Authorization', bearer(client)).set('Idempotency-Key', key).send({ source });
  const refund = (paymentId: string, body: object, key: string = randomUUID(), client = ALICE) =>
    request(t.url).post(`/payments/${paymentId}/refunds`).set('Authorization', bearer(client)).set('Idempotency-Key', key).send(body);
  const cancel = (orderId: string) => request(t.url).post(`/orders/${orderId}/cancel`).set('Authorization', bearer(ALICE));

  /** The provider's ledger for an order. */
  async function charges(orderId: string): Promise<{ id: string; status: string }[]> {
    const res = await request(t.url).get(`/psp/charges`).set('Authorization', PSP_AUTH).query({ orderId });
    expect(res.status).toBe(200);
    return res.body.items;
  }

  async function paymentsOf(
    orderId: string,
  ): Promise<{ id: string; status: string; failure_code: string | null; refunded_minor: string }[]> {
    return (
      await t.db.query(`SELECT id, status, failure_code, refunded_minor FROM payments WHERE order_id = $1 ORDER BY created_at`, [orderId])
    ).rows;
  }

  async function orderState(orderId: string): Promise<{ status: string; paid_events: number; refunded_events: number }> {
    const { rows } = await t.db.query(
      `SELECT status,
              (SELECT count(*)::int FROM order_events WHERE order_id = o.id AND to_status = 'paid') AS paid_events,
              (SELECT count(*)::int FROM order_events WHERE order_id = o.id AND to_status = 'refunded') AS refunded_events
         FROM orders o WHERE id = $1`,
      [orderId],
    );
    return rows[0];
  }

  async function unfinishedKeys(): Promise<number> {
    const { rows } = await t.db.query(`SELECT count(*)::int AS n FROM idempotency_keys WHERE state = 'in_progress'`);
    return rows[0].n;
  }

  const reconcile = () => t.app.get(PaymentReconciler).reconcile();

  /** Retries one request as a client would (409 in use, 503 pending: honour Retry-After) until a final answer. */
  async function untilFinal(send: () => request.Test): Promise<request.Response> {
    const deadline = Date.now() + 30_000;
    for (;;) {
      const res = await send();
      if (res.status !== 409 || res.body.type !== 'urn:idempotent-orders:problem:idempotency-key-in-use') {
        if (res.status !== 503) return res;
      }
      if (Date.now() > deadline) throw new Error(`still ${res.status} ${res.text}`);
      await new Promise((r) => setTimeout(r, Number(res.headers['retry-after'] ?? 1) * 1000));
    }
  }

  describe('paying', () => {
    it('an active payment only the unique index sees (no pending row to find first) is named in a 409, not a 500', async () => {
      const orderId = await createOrder(2500);
      // A state the service never makes (a succeeded payment of an order still 'created'): it is the way to reach
      // ux_payments_one_active_per_order's refusal, which aborts the transaction the answer is then read in.
      const { rows } = await t.db.query(
        `INSERT INTO payments (client_id, order_id, status, amount_minor, currency, source, provider_transaction_id, outbound_key)
         VALUES ('alice', $1, 'succeeded', 2500, 'EUR', 'tok_visa', 'ch_test_' || gen_random_uuid(), 'test_' || gen_random_uuid()) RETURNING id`,
        [orderId],
      );
      const res = await pay(orderId, 'tok_visa');
      expect(res.status).toBe(409);
      expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
      expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:payment-in-progress', paymentId: rows[0].id });
      expect(await charges(orderId)).toEqual([]);
      expect(await paymentsOf(orderId)).toHaveLength(1);
      expect(await unfinishedKeys()).toBe(0);
    });

    it('tok_visa: 201 + Location, the payment succeeded, the order paid with one history row, one charge at the provider', async () => {
      const orderId = await createOrder(2500);
      const res = await pay(orderId, 'tok_visa');
      expect(res.status).toBe(201);
      expect(res.headers.location).toBe(`/payments/${res.body.id}`);
      expect(res.body).toMatchObject({
        orderId,
        status: 'succeeded',
        amountMinor: 2500,
        currency: 'EUR',
        provider: 'sandbox',
        refundedMinor: 0,
        failureCode: null,
      });
      expect(res.body.providerTransactionId).toMatch(/^ch_/);
      const get = await request(t.url).get(`/payments/${res.body.id}`).set('Authorization', bearer(ALICE));
      expect(get.status).toBe(200);
      expect(get.body).toEqual(res.body);
      const list = await request(t.url).get(`/orders/${orderId}/payments`).set('Authorization', bearer(ALICE));
      expect(list.body).toEqual({ items: [res.body] });
      expect(await orderState(orderId)).toEqual({ status: 'paid', paid_events: 1, refunded_events: 0 });
      const ledger = await charges(orderId);
      expect(ledger).toHaveLength(1);
      expect(ledger[0]).toMatchObject({ id: res.body.providerTransactionId, status: 'succeeded' });
    });

    it('a replay is byte-identical, says Idempotent-Replayed, and charges nothing', async () => {
      const orderId = await createOrder();
      const key = randomUUID();
      const first = await pay(orderId, 'tok_visa', key);
      const again = await pay(orderId, 'tok_visa', key);
      expect(again.status).toBe(first.status);
      expect(again.text).toBe(first.text);
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.headers.location).toBe(first.headers.location);
      expect(again.headers['content-type']).toBe(first.headers['content-type']);
      expect(await charges(orderId)).toHaveLength(1);
    });

    it('20 parallel pays with one key: one payment, one charge; every answer is that payment or one to retry (409, or 503 while pending)', async () => {
      const orderId = await createOrder();
      const key = randomUUID();
      const answers = await Promise.all(Array.from({ length: 20 }, () => pay(orderId, 'tok_visa', key)));
      for (const r of answers.filter((a) => a.status !== 201)) {
        // On a loaded machine the provider call itself can time out: 503 payment-pending, the key retried below.
        expect([409, 503]).toContain(r.status);
        expect(['urn:idempotent-orders:problem:idempotency-key-in-use', 'urn:idempotent-orders:problem:payment-pending']).toContain(
          r.body.type,
        );
        expect(Number(r.headers['retry-after'])).toBeGreaterThanOrEqual(1);
      }
      const final = await untilFinal(() => pay(orderId, 'tok_visa', key));
      expect(final.status).toBe(201);
      for (const r of answers.filter((a) => a.status === 201)) expect(r.body.id).toBe(final.body.id);
      expect(await paymentsOf(orderId)).toHaveLength(1);
      expect(await charges(orderId)).toHaveLength(1);
      expect(await orderState(orderId)).toMatchObject({ status: 'paid', paid_events: 1 });
    });

    it('10 parallel pays of one order with different keys: one payment, one charge; the rest 409', async () => {
      const orderId = await createOrder();
      const answers = await Promise.all(Array.from({ length: 10 }, () => pay(orderId, 'tok_visa')));
      expect(answers.filter((r) => r.status === 201)).toHaveLength(1);
      for (const r of answers.filter((a) => a.status !== 201)) {
        expect(r.status).toBe(409);
        expect(['urn:idempotent-orders:problem:payment-in-progress', 'urn:idempotent-orders:problem:order-not-payable']).toContain(
          r.body.type,
        );
      }
      expect((await paymentsOf(orderId)).filter((p) => p.status !== 'failed')).toHaveLength(1);
      expect(await charges(orderId)).toHaveLength(1);
      expect(await orderState(orderId)).toMatchObject({ status: 'paid', paid_events: 1 });
    });

    it('a decline is a stored 402; the order stays created; a new key then pays it', async () => {
      const orderId = await createOrder();
      const key = randomUUID();
      const declined = await pay(orderId, 'tok_chargeDeclined', key);
      expect(declined.status).toBe(402);
      expect(declined.headers['content-type']).toMatch(PROBLEM_JSON);
      expect(declined.body).toMatchObject({
        type: 'urn:idempotent-orders:problem:payment-declined',
        failureCode: 'card_declined',
        paymentId: expect.any(String),
      });
      const again = await pay(orderId, 'tok_chargeDeclined', key);
      expect(again.status).toBe(402);
      expect(again.text).toBe(declined.text);
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(await orderState(orderId)).toMatchObject({ status: 'created', paid_events: 0 });
      const paid = await pay(orderId, 'tok_visa');
      expect(paid.status).toBe(201);
      expect((await paymentsOf(orderId)).map((p) => p.status)).toEqual(['failed', 'succeeded']);
      expect((await charges(orderId)).map((c) => c.status).sort()).toEqual(['failed', 'succeeded']);
    });

    it('an unknown source is refused by the provider: 402 invalid_source, nothing charged', async () => {
      const orderId = await createOrder();
      const res = await pay(orderId, 'tok_nonsense');
      expect(res.status).toBe(402);
      expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:payment-declined', failureCode: 'invalid_source' });
      expect(await charges(orderId)).toHaveLength(0);
      expect(await orderState(orderId)).toMatchObject({ status: 'created' });
    });

    it('tok_flaky: the client retries the 503s under the same outbound key, then 201 with one charge', async () => {
      const orderId = await createOrder();
      const res = await pay(orderId, 'tok_flaky');
      expect(res.status).toBe(201);
      expect(await charges(orderId)).toHaveLength(1);
      expect(await orderState(orderId)).toMatchObject({ status: 'paid', paid_events: 1 });
    });

    it('tok_timeout: the first attempt times out, the retry gets the charge the first one recorded: 201, one charge', async () => {
      const orderId = await createOrder();
      const res = await pay(orderId, 'tok_timeout');
      expect(res.status).toBe(201);
      const ledger = await charges(orderId);
      expect(ledger).toHaveLength(1);
      expect(res.body.providerTransactionId).toBe(ledger[0].id);
    });

    it('tok_slow answers within the timeout: 201', async () => {
      const orderId = await createOrder();
      expect((await pay(orderId, 'tok_slow')).status).toBe(201);
    });
  });

  describe('outcomes the provider did not tell us', () => {
    it('tok_lost: 503 payment-pending, the payment stays pending; the reconciler settles it; the key then answers 201 with that payment', async () => {
      const orderId = await createOrder();
      const key = randomUUID();
      const lost = await pay(orderId, 'tok_lost', key);
      expect(lost.status).toBe(503);
      expect(lost.headers['content-type']).toMatch(PROBLEM_JSON);
      expect(lost.body).toMatchObject({ type: 'urn:idempotent-orders:problem:payment-pending', paymentId: expect.any(String) });
      expect(Number(lost.headers['retry-after'])).toBeGreaterThanOrEqual(1);
      expect(await paymentsOf(orderId)).toMatchObject([{ id: lost.body.paymentId, status: 'pending' }]);
      // A pending payment that someone is still deciding blocks a cancel: the charge may have gone through (it did).
      // (Its key held as a request in flight holds it; one past its lease is settled first, see "a cancel that finds…".)
      const keyOf = `SELECT idempotency_key_id FROM payments WHERE id = $1`;
      await t.db.query(`UPDATE idempotency_keys SET locked_until = clock_timestamp() + interval '1 minute' WHERE id = (${keyOf})`, [
        lost.body.paymentId,
      ]);
      const refused = await cancel(orderId);
      expect(refused.status).toBe(409);
      expect(refused.body).toMatchObject({ type: 'urn:idempotent-orders:problem:payment-in-progress', paymentId: lost.body.paymentId });
      await t.db.query(`UPDATE idempotency_keys SET locked_until = clock_timestamp() WHERE id = (${keyOf})`, [lost.body.paymentId]);

      expect(await reconcile()).toBeGreaterThanOrEqual(1);
      expect(await paymentsOf(orderId)).toMatchObject([{ id: lost.body.paymentId, status: 'succeeded' }]);
      expect(await orderState(orderId)).toMatchObject({ status: 'paid', paid_events: 1 });
      const retried = await pay(orderId, 'tok_lost', key);
      expect(retried.status).toBe(201);
      expect(retried.headers['idempotent-replayed']).toBe('true');
      expect(retried.body).toMatchObject({ id: lost.body.paymentId, status: 'succeeded' });
      expect(await charges(orderId)).toHaveLength(1);
      expect(await unfinishedKeys()).toBe(0);
    });

    it('tok_lost, retried with the same key before any reconciler: the retry looks the charge up and answers 201', async () => {
      const orderId = await createOrder();
      const key = randomUUID();
      const lost = await pay(orderId, 'tok_lost', key);
      expect(lost.status).toBe(503);
      const retried = await pay(orderId, 'tok_lost', key);
      expect(retried.status).toBe(201);
      expect(retried.body.id).toBe(lost.body.paymentId);
      expect(await charges(orderId)).toHaveLength(1);
      expect(await orderState(orderId)).toMatchObject({ status: 'paid', paid_events: 1 });
    });

    it('tok_unavailable: 503 pending; the provider never saw it, so the reconciler fails it provider_unreachable and the key answers 402', async () => {
      const orderId = await createOrder();
      const key = randomUUID();
      const res = await pay(orderId, 'tok_unavailable', key);
      expect(res.status).toBe(503);
      expect(res.body.type).toBe('urn:idempotent-orders:problem:payment-pending');
      expect(await reconcile()).toBeGreaterThanOrEqual(1);
      expect(await paymentsOf(orderId)).toMatchObject([{ status: 'failed', failure_code: 'provider_unreachable' }]);
      const retried = await pay(orderId, 'tok_unavailable', key);
      expect(retried.status).toBe(402);
      expect(retried.body).toMatchObject({
        type: 'urn:idempotent-orders:problem:payment-declined',
        failureCode: 'provider_unreachable',
        paymentId: res.body.paymentId,
      });
      expect(await charges(orderId)).toHaveLength(0);
      expect(await orderState(orderId)).toMatchObject({ status: 'created' });
      // Failed: the order may be paid again with a new key.
      expect((await pay(orderId, 'tok_visa')).status).toBe(201);
    });
  });

  /**
   * A lost payment whose key a slow holder took and then stalled past its lease (made to run out here), and a
   * fresh holder took over.
   */
  async function twoHolders() {
    const orderId = await createOrder();
    const lost = await pay(orderId, 'tok_lost');
    expect(lost.status).toBe(503);
    const { rows } = await t.db.query(`SELECT idempotency_key_id AS key_id FROM payments WHERE id = $1`, [lost.body.paymentId]);
    const keyId = rows[0].key_id as string;
    const phases = t.app.get(AtomicPhases);
    const slow = await phases.takeOverLease(keyId);
    expect(slow).toBeDefined();
    await t.db.query(`UPDATE idempotency_keys SET locked_until = clock_timestamp() - interval '1 second' WHERE id = $1`, [keyId]);
    const fresh = await phases.takeOverLease(keyId);
    expect(fresh?.leaseToken).not.toBe(slow!.leaseToken);
    return {
      orderId,
      paymentId: lost.body.paymentId as string,
      keyId,
      slow: slow!,
      fresh: fresh!,
      phases,
      settlement: t.app.get(PaymentSettlement),
    };
  }

  describe("the provider's confirmation is never dropped", () => {
    it('a holder whose lease was taken over still applies a confirmed charge, as a webhook would; the new holder then gets that answer', async () => {
      const { orderId, paymentId, slow, fresh, settlement } = await twoHolders();
      const [charge] = await charges(orderId);
      const confirmed = await settlement.settlePayment(paymentId, { status: 'succeeded', providerId: charge.id }, slow.leaseToken);
      expect(confirmed).toMatchObject({ kind: 'answered', changed: true, response: { status: 201 } });
      expect(await orderState(orderId)).toMatchObject({ status: 'paid', paid_events: 1 });
      const after = await settlement.settlePayment(paymentId, { status: 'succeeded', providerId: charge.id }, fresh.leaseToken);
      expect(after).toMatchObject({ kind: 'answered', changed: false, response: { status: 201 } });
      expect(await unfinishedKeys()).toBe(0);
    });

    it('a confirmed charge for a payment already failed as never reached is handed to the late-charge refund, and the sweep stops asking', async () => {
      const orderId = await createOrder();
      const unreachable = await pay(orderId, 'tok_unavailable');
      expect(unreachable.status).toBe(503);
      expect(await reconcile()).toBeGreaterThanOrEqual(1);
      const paymentId = unreachable.body.paymentId as string;
      expect(await paymentsOf(orderId)).toMatchObject([{ status: 'failed', failure_code: 'provider_unreachable' }]);
      const { rows: watched } = await t.db.query(`SELECT recheck_at IS NOT NULL AS watched FROM provider_attempts WHERE subject_id = $1`, [
        paymentId,
      ]);
      expect(watched).toEqual([{ watched: true }]);
      // A settler that learnt of a charge the provider made after all (its id is all the refund needs here).
      const settled = await t.app
        .get(PaymentSettlement)
        .settlePayment(paymentId, { status: 'succeeded', providerId: `ch_late_${randomUUID()}` });
      expect(settled).toMatchObject({ kind: 'answered', changed: false, response: { status: 402 } });
      const { rows: late } = await t.db.query(`SELECT charge_id FROM late_charge_refunds WHERE payment_id = $1`, [paymentId]);
      expect(late).toHaveLength(1);
      const { rows: after } = await t.db.query(`SELECT recheck_at FROM provider_attempts WHERE subject_id = $1`, [paymentId]);
      expect(after).toEqual([{ recheck_at: null }]);
      expect(await paymentsOf(orderId)).toMatchObject([{ status: 'failed' }]);
    });
  });

  describe('a cancel that finds a pending payment past its lease', () => {
    it('settles it first: the lost charge succeeded, so the order was paid and the cancel moves it on (one charge, one paid event)', async () => {
      const orderId = await createOrder();
      const lost = await pay(orderId, 'tok_lost');
      expect(lost.status).toBe(503);
      const cancelled = await cancel(orderId);
      expect(cancelled.status).toBe(200);
      expect(cancelled.body.status).toBe('cancelled');
      expect(await paymentsOf(orderId)).toMatchObject([{ id: lost.body.paymentId, status: 'succeeded' }]);
      expect(await orderState(orderId)).toMatchObject({ status: 'cancelled', paid_events: 1 });
      expect(await charges(orderId)).toHaveLength(1);
      expect(await unfinishedKeys()).toBe(0);
    });
  });

  describe('lease fencing', () => {
    it('a holder whose lease ran out and was taken over can decide nothing: its writes match no row; the new holder settles', async () => {
      const { orderId, paymentId, keyId, slow, fresh, phases, settlement } = await twoHolders();
      // Its own decision ("never reached", no provider id) counts only under its lease.
      const stale = await settlement.settlePayment(paymentId, { status: 'failed', failureCode: 'provider_unreachable' }, slow.leaseToken);
      expect(stale.kind).toBe('lost');
      expect(await paymentsOf(orderId)).toMatchObject([{ status: 'pending' }]);

      const [charge] = await charges(orderId);
      const settled = await settlement.settlePayment(paymentId, { status: 'succeeded', providerId: charge.id }, fresh.leaseToken);
      expect(settled).toMatchObject({ kind: 'answered', changed: true });
      expect(await paymentsOf(orderId)).toMatchObject([{ status: 'succeeded' }]);
      // The slow holder still cannot release or complete anything.
      await phases.release(slow);
      const { rows: key } = await t.db.query(`SELECT state, response_status FROM idempotency_keys WHERE id = $1`, [keyId]);
      expect(key[0]).toEqual({ state: 'completed', response_status: 201 });
    });
  });

  describe('a pending payment whose request gave up, found by a new key (reconciler off)', () => {
    it('settles it first: the lost charge succeeded, so the order is paid and the new key gets a stored 409 order-not-payable', async () => {
      const orderId = await createOrder();
      const lost = await pay(orderId, 'tok_lost');
      expect(lost.status).toBe(503);
      const other = await pay(orderId, 'tok_visa');
      expect(other.status).toBe(409);
      expect(other.body).toMatchObject({ type: 'urn:idempotent-orders:problem:order-not-payable', currentStatus: 'paid' });
      expect(await paymentsOf(orderId)).toMatchObject([{ id: lost.body.paymentId, status: 'succeeded' }]);
      expect(await charges(orderId)).toHaveLength(1);
    });

    it('settles it first: the provider never saw it, so it fails provider_unreachable and the new key pays', async () => {
      const orderId = await createOrder();
      const unreachable = await pay(orderId, 'tok_unavailable');
      expect(unreachable.status).toBe(503);
      const other = await pay(orderId, 'tok_visa');
      expect(other.status).toBe(201);
      expect((await paymentsOf(orderId)).map((p) => [p.status, p.failure_code])).toEqual([
        ['failed', 'provider_unreachable'],
        ['succeeded', null],
      ]);
      expect(await charges(orderId)).toHaveLength(1);
    });
  });

  describe('refunds', () => {
    async function paidAndCancelled(totalMinor: number): Promise<{ orderId: string; paymentId: string }> {
      const orderId = await createOrder(totalMinor);
      const paid = await pay(orderId, 'tok_visa');
      expect(paid.status).toBe(201);
      expect((await cancel(orderId)).status).toBe(200);
      return { orderId, paymentId: paid.body.id };
    }

    it('8 parallel partial refunds never exceed the payment: 3 of 300 fit in 1000, the rest are 422', async () => {
      const { orderId, paymentId } = await paidAndCancelled(1000);
      const keys = Array.from({ length: 8 }, () => randomUUID());
      await Promise.all(keys.map((key) => refund(paymentId, { amountMinor: 300 }, key)));
      // Each key to its final answer (a provider call that timed out on a loaded machine answered 503 refund-pending).
      const answers = await Promise.all(keys.map((key) => untilFinal(() => refund(paymentId, { amountMinor: 300 }, key))));
      expect(answers.filter((r) => r.status === 201)).toHaveLength(3);
      for (const r of answers.filter((a) => a.status !== 201)) {
        expect(r.status).toBe(422);
        expect(r.body.type).toBe('urn:idempotent-orders:problem:refund-exceeds-payment');
      }
      const { rows } = await t.db.query(
        `SELECT coalesce(sum(amount_minor), 0)::int AS refunded FROM refunds WHERE payment_id = $1 AND status = 'succeeded'`,
        [paymentId],
      );
      expect(rows[0].refunded).toBe(900);
      expect(await paymentsOf(orderId)).toMatchObject([{ refunded_minor: '900' }]);
      expect(await orderState(orderId)).toMatchObject({ status: 'cancelled', refunded_events: 0 });
      // What remains, by default: the order becomes refunded, with one history row.
      const rest = await refund(paymentId, {});
      expect(rest.status).toBe(201);
      expect(rest.body).toMatchObject({ paymentId, amountMinor: 100, status: 'succeeded' });
      expect(rest.headers.location).toBe(`/refunds/${rest.body.id}`);
      expect(await orderState(orderId)).toMatchObject({ status: 'refunded', refunded_events: 1 });
      const list = await request(t.url).get(`/payments/${paymentId}/refunds`).set('Authorization', bearer(ALICE));
      expect(list.body.items).toHaveLength(4);
      const one = await request(t.url).get(`/refunds/${rest.body.id}`).set('Authorization', bearer(ALICE));
      expect(one.body).toEqual(rest.body);
    });

    it('a full refund replays byte for byte and refunds once', async () => {
      const { orderId, paymentId } = await paidAndCancelled(700);
      const key = randomUUID();
      const first = await refund(paymentId, {}, key);
      expect(first.status).toBe(201);
      const again = await refund(paymentId, {}, key);
      expect(again.text).toBe(first.text);
      expect(again.headers['idempotent-replayed']).toBe('true');
      const ledger = await request(t.url)
        .get('/psp/refunds')
        .set('Authorization', PSP_AUTH)
        .query({ chargeId: (await charges(orderId))[0].id });
      expect(ledger.body.items).toHaveLength(1);
      expect(await orderState(orderId)).toMatchObject({ status: 'refunded', refunded_events: 1 });
    });

    it('a refund of a payment whose order is not cancelled is a stored 409 refund-not-allowed', async () => {
      const orderId = await createOrder();
      const paid = await pay(orderId, 'tok_visa');
      const key = randomUUID();
      const res = await refund(paid.body.id, {}, key);
      expect(res.status).toBe(409);
      expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:refund-not-allowed', orderStatus: 'paid' });
      expect((await refund(paid.body.id, {}, key)).headers['idempotent-replayed']).toBe('true');
    });

    it('a declined refund is a stored 402 and gives its reservation back', async () => {
      const orderId = await createOrder(900);
      const paid = await pay(orderId, 'tok_refundDeclined');
      expect(paid.status).toBe(201);
      expect((await cancel(orderId)).status).toBe(200);
      const res = await refund(paid.body.id, { amountMinor: 400 });
      expect(res.status).toBe(402);
      expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:refund-declined', paymentId: paid.body.id });
      expect(await paymentsOf(orderId)).toMatchObject([{ refunded_minor: '0' }]);
    });
  });

  describe('bad input: a clear problem, nothing charged', () => {
    it('missing key, empty body, unknown fields, bad source: 400 and no payment', async () => {
      const orderId = await createOrder();
      const noKey = await request(t.url)
        .post(`/orders/${orderId}/payments`)
        .set('Authorization', bearer(ALICE))
        .send({ source: 'tok_visa' });
      expect(noKey.status).toBe(400);
      expect(noKey.body.type).toBe('urn:idempotent-orders:problem:idempotency-key-missing');
      for (const body of [{}, { source: 'tok_visa', amountMinor: 1 }, { source: 42 }, { source: 'tok visa' }]) {
        const res = await request(t.url)
          .post(`/orders/${orderId}/payments`)
          .set('Authorization', bearer(ALICE))
          .set('Idempotency-Key', randomUUID())
          .send(body);
        expect(res.status).toBe(400);
        expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
      }
      expect(await paymentsOf(orderId)).toHaveLength(0);
      expect(await charges(orderId)).toHaveLength(0);
    });

    it('a key reused with another body is a 422 and charges nothing more', async () => {
      const orderId = await createOrder();
      const key = randomUUID();
      expect((await pay(orderId, 'tok_chargeDeclined', key)).status).toBe(402);
      const reused = await pay(orderId, 'tok_visa', key);
      expect(reused.status).toBe(422);
      expect(reused.body.type).toBe('urn:idempotent-orders:problem:idempotency-key-reused');
      expect(await charges(orderId)).toHaveLength(1);
    });

    it("another client's order or payment is a 404, and nothing is charged", async () => {
      const orderId = await createOrder();
      const bob = await pay(orderId, 'tok_visa', randomUUID(), BOB);
      expect(bob.status).toBe(404);
      expect(await charges(orderId)).toHaveLength(0);
      const paid = await pay(orderId, 'tok_visa');
      expect((await request(t.url).get(`/payments/${paid.body.id}`).set('Authorization', bearer(BOB))).status).toBe(404);
      expect((await request(t.url).get(`/orders/${orderId}/payments`).set('Authorization', bearer(BOB))).status).toBe(404);
      expect((await refund(paid.body.id, {}, randomUUID(), BOB)).status).toBe(404);
      expect(await charges(orderId)).toHaveLength(1);
    });

    it('an order that is not created is a stored 409 order-not-payable', async () => {
      const orderId = await createOrder();
      expect((await cancel(orderId)).status).toBe(200);
      const key = randomUUID();
      const res = await pay(orderId, 'tok_visa', key);
      expect(res.status).toBe(409);
      expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:order-not-payable', currentStatus: 'cancelled' });
      expect((await pay(orderId, 'tok_visa', key)).headers['idempotent-replayed']).toBe('true');
      expect(await charges(orderId)).toHaveLength(0);
    });
  });
});

describe('payments: the reconciler on its schedule, and the circuit breaker', () => {
  let t: TestApp;

  beforeAll(async () => {
    t = await startTestApp({
      PSP_TIMEOUT_MS: '300',
      PSP_MAX_ATTEMPTS: '3',
      IDEMPOTENCY_LEASE_SECONDS: '5',
      RECONCILE_INTERVAL_MS: '200',
      PSP_WEBHOOK_URL: 'none',
      // One unknown outcome opens a charge breaker, for a minute: long enough to see it refuse.
      PSP_BREAKER_THRESHOLD: '1',
      PSP_BREAKER_HALF_OPEN_MS: '60000',
    });
  });
  afterAll(async () => {
    await t?.close();
  });

  async function createOrder(client = ALICE): Promise<string> {
    const res = await request(t.url)
      .post('/orders')
      .set('Authorization', bearer(client))
      .set('Idempotency-Key', randomUUID())
      .send({ currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 800 }] });
    expect(res.status).toBe(201);
    return res.body.id as string;
  }
  const pay = (orderId: string, source: string, key: string = randomUUID(), client = ALICE) =>
    request(t.url).post(`/orders/${orderId}/payments`).set('Authorization', bearer(client)).set('Idempotency-Key', key).send({ source });

  it("a lost answer is settled by the scheduled reconciler alone; then the client's open breaker refuses its next fault token before writing anything", async () => {
    const orderId = await createOrder();
    const key = randomUUID();
    const lost = await pay(orderId, 'tok_lost', key);
    expect(lost.status).toBe(503);
    expect(lost.body.type).toBe('urn:idempotent-orders:problem:payment-pending');

    // Nobody retries: the reconciler's own ticks settle it (a poll with a deadline, not a sleep).
    const deadline = Date.now() + 30_000;
    for (;;) {
      const { rows } = await t.db.query(`SELECT status FROM payments WHERE id = $1`, [lost.body.paymentId]);
      if (rows[0].status === 'succeeded') break;
      if (Date.now() > deadline) throw new Error(`payment still ${rows[0].status}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    const replayed = await pay(orderId, 'tok_lost', key);
    expect(replayed.status).toBe(201);
    expect(replayed.body.id).toBe(lost.body.paymentId);

    // The lost call counted as one failed call against Alice's own test-token breaker: with a threshold of 1 it is open now.
    const other = await createOrder();
    const refused = await pay(other, 'tok_unavailable');
    expect(refused.status).toBe(503);
    expect(refused.body.type).toBe('urn:idempotent-orders:problem:provider-unavailable');
    expect(Number(refused.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    const { rows: written } = await t.db.query(`SELECT count(*)::int AS n FROM payments WHERE order_id = $1`, [other]);
    expect(written[0].n).toBe(0);
    const { rows: keys } = await t.db.query(`SELECT count(*)::int AS n FROM idempotency_keys WHERE state = 'in_progress'`);
    expect(keys[0].n).toBe(0);

    // tok_lost was Alice's choice, not the provider's state: the shared breaker is closed, and Bob's card is charged.
    const bobs = await pay(await createOrder(BOB), 'tok_visa', randomUUID(), BOB);
    expect({ status: bobs.status, paymentStatus: bobs.body.status }).toEqual({ status: 201, paymentStatus: 'succeeded' });
  });
});
