import { jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { createHmac, randomUUID } from 'node:crypto';
import { Webhook } from 'standardwebhooks';
import request from 'supertest';
import type { PspCallResult, PspRefund, RefundRequest } from '../src/psp-client/psp-client';
import { PspClient } from '../src/psp-client/psp-client';
import { LATE_REFUND_RETRY_FIRST_SECONDS, LATE_REFUND_RETRY_MAX_SECONDS, LateChargeRefunder } from '../src/payments/late-charge-refunder';
import { LATE_REFUND_ALERT_ATTEMPTS } from '../src/payments/payment-metrics';
import { ProcessedWebhookEventReaper } from '../src/webhooks/processed-webhook-event-reaper';
import { ALICE, bearer, startTestApp, type TestApp } from './support/test-app';

const PROBLEM_JSON = /^application\/problem\+json/;
/** whsec_ + base64 of 32 bytes, as PSP_WEBHOOK_SECRET must be. */
const SECRET = `whsec_${Buffer.from('webhooks-e2e-secret-of-32-bytes!').toString('base64')}`;
const OTHER_SECRET = `whsec_${Buffer.from('an-old-secret-that-was-rotated!!').toString('base64')}`;
const signer = new Webhook(SECRET);

interface Delivery {
  id?: string;
  /** When the delivery was signed (default: now). */
  at?: Date;
  /** The whole webhook-signature header (default: one valid v1 signature). */
  signature?: (valid: string) => string | undefined;
}

/**
 * The consumer of the provider's webhooks, against real PostgreSQL. Deliveries are signed here
 * with the app's secret; orders are created over HTTP, pending payments and refunds with SQL, so
 * nothing depends on the sandbox. Every test reads the database afterwards.
 */
describe('webhooks: each provider event applied once, whatever is redelivered', () => {
  let t: TestApp;
  let numbers = 0;

  beforeAll(async () => {
    t = await startTestApp({
      PSP_WEBHOOK_SECRET: SECRET,
      RECONCILE_INTERVAL_MS: '0',
      // A concurrent redelivery waits for the first delivery's transaction on the event row; on this
      // loaded machine give it time, so the test sees the duplicate rather than a lock timeout (503).
      IDEMPOTENCY_WAIT_MS: '15000',
    });
  });
  afterAll(async () => {
    await t?.close();
  });

  function deliver(event: unknown, d: Delivery = {}) {
    const id = d.id ?? `msg_${randomUUID()}`;
    const body = typeof event === 'string' ? event : JSON.stringify(event);
    const at = d.at ?? new Date();
    const valid = signer.sign(id, at, body);
    const signature = d.signature ? d.signature(valid) : valid;
    const req = request(t.url)
      .post('/webhooks/psp')
      .set('Content-Type', 'application/json')
      .set('webhook-id', id)
      .set('webhook-timestamp', String(Math.floor(at.getTime() / 1000)));
    if (signature !== undefined) req.set('webhook-signature', signature);
    return req.send(body);
  }

  async function createOrder(totalMinor = 2500): Promise<string> {
    const res = await request(t.url)
      .post('/orders')
      .set('Authorization', bearer(ALICE))
      .set('Idempotency-Key', randomUUID())
      .send({ orderNumber: `WH-${++numbers}`, currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: totalMinor }] });
    expect(res.status).toBe(201);
    return res.body.id as string;
  }

  interface Paid {
    orderId: string;
    paymentId: string;
    amountMinor: number;
  }

  /** An order with a payment in `status`, written as the payments module would have left it. */
  async function orderWithPayment(
    status: 'pending' | 'failed' = 'pending',
    amountMinor = 2500,
    keyId: string | null = null,
  ): Promise<Paid> {
    const orderId = await createOrder(amountMinor);
    const { rows } = await t.db.query(
      `INSERT INTO payments (client_id, order_id, idempotency_key_id, status, amount_minor, currency, source, outbound_key, failure_code)
       VALUES ('alice', $1, $2, $3, $4, 'EUR', 'tok_visa', 'payment_' || gen_random_uuid(), $5) RETURNING id`,
      [orderId, keyId, status, amountMinor, status === 'failed' ? 'provider_unreachable' : null],
    );
    return { orderId, paymentId: rows[0].id, amountMinor };
  }

  const chargeEvent = (type: 'charge.succeeded' | 'charge.failed', p: Paid, data: Record<string, unknown> = {}) => ({
    type,
    timestamp: new Date().toISOString(),
    data: {
      chargeId: `ch_${p.paymentId.slice(0, 8)}`,
      paymentId: p.paymentId,
      orderId: p.orderId,
      amountMinor: p.amountMinor,
      currency: 'EUR',
      status: type === 'charge.succeeded' ? 'succeeded' : 'failed',
      ...(type === 'charge.failed' ? { failureCode: 'card_declined' } : {}),
      ...data,
    },
  });

  async function payment(paymentId: string) {
    return (
      await t.db.query(`SELECT status, provider_transaction_id, failure_code, refunded_minor FROM payments WHERE id = $1`, [paymentId])
    ).rows[0];
  }

  async function order(orderId: string): Promise<{ status: string; paid_events: number; refunded_events: number }> {
    const { rows } = await t.db.query(
      `SELECT status,
              (SELECT count(*)::int FROM order_events WHERE order_id = o.id AND to_status = 'paid') AS paid_events,
              (SELECT count(*)::int FROM order_events WHERE order_id = o.id AND to_status = 'refunded') AS refunded_events
         FROM orders o WHERE id = $1`,
      [orderId],
    );
    return rows[0];
  }

  async function processed(webhookId: string) {
    return (
      await t.db.query(
        `SELECT type, outcome, detail, payment_id, refund_id, received_at FROM processed_webhook_events WHERE webhook_id = $1`,
        [webhookId],
      )
    ).rows;
  }

  async function metric(name: string, labels: string): Promise<number> {
    const res = await request(t.url).get('/metrics');
    expect(res.status).toBe(200);
    const line = res.text.split('\n').find((l) => l.startsWith(`${name}{${labels}}`));
    return line ? Number(line.split(' ').pop()) : 0;
  }

  describe('applying', () => {
    it('charge.succeeded settles a pending payment and pays its order: applied, one history row, one processed row', async () => {
      const p = await orderWithPayment();
      const id = `msg_${randomUUID()}`;
      const res = await deliver(chargeEvent('charge.succeeded', p), { id });
      expect(res.status).toBe(200);
      expect(res.body).toEqual({ webhookId: id, outcome: 'applied', detail: 'payment-succeeded' });
      expect(await payment(p.paymentId)).toMatchObject({ status: 'succeeded', provider_transaction_id: `ch_${p.paymentId.slice(0, 8)}` });
      expect(await order(p.orderId)).toMatchObject({ status: 'paid', paid_events: 1 });
      expect(await processed(id)).toEqual([
        expect.objectContaining({ type: 'charge.succeeded', outcome: 'applied', detail: 'payment-succeeded', payment_id: p.paymentId }),
      ]);
    });

    it('one event delivered 5 times in sequence: one effect, one history row, one processed row; the rest answer duplicate', async () => {
      const p = await orderWithPayment();
      const id = `msg_${randomUUID()}`;
      const event = chargeEvent('charge.succeeded', p);
      const outcomes: string[] = [];
      for (let i = 0; i < 5; i++) {
        const res = await deliver(event, { id });
        expect(res.status).toBe(200);
        outcomes.push(res.body.outcome);
      }
      expect(outcomes).toEqual(['applied', 'duplicate', 'duplicate', 'duplicate', 'duplicate']);
      expect(await order(p.orderId)).toMatchObject({ status: 'paid', paid_events: 1 });
      expect(await processed(id)).toHaveLength(1);
    });

    it('one event delivered 5 times at once: exactly one applies, the others wait for it and answer duplicate', async () => {
      const p = await orderWithPayment();
      const id = `msg_${randomUUID()}`;
      const event = chargeEvent('charge.succeeded', p);
      const results = await Promise.all(Array.from({ length: 5 }, () => deliver(event, { id })));
      expect(results.map((r) => r.status)).toEqual([200, 200, 200, 200, 200]);
      expect(results.map((r) => r.body.outcome).sort()).toEqual(['applied', 'duplicate', 'duplicate', 'duplicate', 'duplicate']);
      expect(await payment(p.paymentId)).toMatchObject({ status: 'succeeded' });
      expect(await order(p.orderId)).toMatchObject({ status: 'paid', paid_events: 1 });
      expect(await processed(id)).toHaveLength(1);
    });

    it('charge.failed fails a pending payment; the order stays created', async () => {
      const p = await orderWithPayment();
      const id = `msg_${randomUUID()}`;
      const res = await deliver(chargeEvent('charge.failed', p), { id });
      expect(res.status).toBe(200);
      expect(res.body.outcome).toBe('applied');
      expect(await payment(p.paymentId)).toMatchObject({ status: 'failed', failure_code: 'card_declined' });
      expect(await order(p.orderId)).toMatchObject({ status: 'created', paid_events: 0 });
      expect(await processed(id)).toEqual([expect.objectContaining({ outcome: 'applied', detail: 'payment-failed' })]);
    });

    it('charge.failed after charge.succeeded (a different event): recorded, nothing moves backwards', async () => {
      const p = await orderWithPayment();
      expect((await deliver(chargeEvent('charge.succeeded', p))).body.outcome).toBe('applied');
      const id = `msg_${randomUUID()}`;
      const res = await deliver(chargeEvent('charge.failed', p), { id });
      expect(res.status).toBe(200);
      expect(res.body.outcome).toBe('no_effect');
      expect(await payment(p.paymentId)).toMatchObject({ status: 'succeeded', failure_code: null });
      expect(await order(p.orderId)).toMatchObject({ status: 'paid', paid_events: 1 });
      expect(await processed(id)).toEqual([
        expect.objectContaining({ outcome: 'no_effect', detail: 'already-settled: payment is succeeded' }),
      ]);
    });

    it('a payment whose request still holds the key lease: the webhook settles it AND completes the key with the 201 the request would give', async () => {
      const { rows } = await t.db.query(
        `INSERT INTO idempotency_keys (client_id, key, fingerprint, request_method, request_path, state, recovery_point, lease_token, locked_until, expires_at)
         VALUES ('alice', $1, 'fp', 'POST', '/orders/x/payments', 'in_progress', 'payment_created', gen_random_uuid(), now() + interval '1 minute', 'infinity')
         RETURNING id`,
        [randomUUID()],
      );
      const keyId = rows[0].id as string;
      const p = await orderWithPayment('pending', 2500, keyId);
      const res = await deliver(chargeEvent('charge.succeeded', p));
      expect(res.status).toBe(200);
      expect(res.body.outcome).toBe('applied');
      const key = (
        await t.db.query(
          `SELECT state, response_status, response_headers, response_body, lease_token FROM idempotency_keys WHERE id = $1`,
          [keyId],
        )
      ).rows[0];
      expect(key).toMatchObject({ state: 'completed', response_status: 201, lease_token: null });
      expect(key.response_headers).toMatchObject({ location: `/payments/${p.paymentId}` });
      expect(JSON.parse(key.response_body)).toMatchObject({ id: p.paymentId, status: 'succeeded', amountMinor: 2500 });
      expect(await order(p.orderId)).toMatchObject({ status: 'paid', paid_events: 1 });
    });

    it('refund.succeeded for the last part of the amount: the refund settles and the order becomes refunded, with one history row', async () => {
      const p = await orderWithPayment('pending', 2500);
      const charge = chargeEvent('charge.succeeded', p);
      expect((await deliver(charge)).body.outcome).toBe('applied');
      expect((await request(t.url).post(`/orders/${p.orderId}/cancel`).set('Authorization', bearer(ALICE))).status).toBe(200);
      // 1000 refunded earlier, 1500 pending (reserved, as phase 1 of a refund leaves it).
      await t.db.query(`UPDATE payments SET refunded_minor = 2500 WHERE id = $1`, [p.paymentId]);
      await t.db.query(
        `INSERT INTO refunds (client_id, payment_id, status, amount_minor, provider_refund_id, outbound_key) VALUES ('alice', $1, 'succeeded', 1000, 're_first', 'refund_' || gen_random_uuid())`,
        [p.paymentId],
      );
      const { rows } = await t.db.query(
        `INSERT INTO refunds (client_id, payment_id, status, amount_minor, outbound_key) VALUES ('alice', $1, 'pending', 1500, 'refund_' || gen_random_uuid()) RETURNING id`,
        [p.paymentId],
      );
      const refundId = rows[0].id as string;
      const event = {
        type: 'refund.succeeded',
        timestamp: new Date().toISOString(),
        data: { ...charge.data, providerRefundId: 're_last', refundId, amountMinor: 1500, status: 'succeeded' },
      };
      const id = `msg_${randomUUID()}`;
      const results = await Promise.all([deliver(event, { id }), deliver(event, { id })]);
      expect(results.map((r) => r.status)).toEqual([200, 200]);
      expect(results.map((r) => r.body.outcome).sort()).toEqual(['applied', 'duplicate']);
      expect((await t.db.query(`SELECT status, provider_refund_id FROM refunds WHERE id = $1`, [refundId])).rows[0]).toEqual({
        status: 'succeeded',
        provider_refund_id: 're_last',
      });
      expect(await order(p.orderId)).toMatchObject({ status: 'refunded', refunded_events: 1 });
      expect(await payment(p.paymentId)).toMatchObject({ refunded_minor: '2500' });
      expect(await processed(id)).toEqual([expect.objectContaining({ type: 'refund.succeeded', outcome: 'applied', refund_id: refundId })]);

      // refund.failed afterwards (another event): nothing moves back, the reservation is not given back.
      const late = await deliver({
        ...event,
        type: 'refund.failed',
        data: { ...event.data, status: 'failed', failureCode: 'refund_declined' },
      });
      expect(late.body.outcome).toBe('no_effect');
      expect(await payment(p.paymentId)).toMatchObject({ refunded_minor: '2500' });
      expect(await order(p.orderId)).toMatchObject({ status: 'refunded', refunded_events: 1 });
    });
  });

  describe('a refund confirmed twice by the provider', () => {
    it('refund.succeeded with another provider refund id for a refund already succeeded: alerted and counted, as a second charge is; nothing moves', async () => {
      const p = await orderWithPayment('pending', 2500);
      const charge = chargeEvent('charge.succeeded', p);
      expect((await deliver(charge)).body.outcome).toBe('applied');
      expect((await request(t.url).post(`/orders/${p.orderId}/cancel`).set('Authorization', bearer(ALICE))).status).toBe(200);
      await t.db.query(`UPDATE payments SET refunded_minor = 2500 WHERE id = $1`, [p.paymentId]);
      const { rows } = await t.db.query(
        `INSERT INTO refunds (client_id, payment_id, status, amount_minor, provider_refund_id, outbound_key) VALUES ('alice', $1, 'succeeded', 2500, gen_random_uuid()::text, 'refund_' || gen_random_uuid()) RETURNING id`,
        [p.paymentId],
      );
      const refundId = rows[0].id as string;
      const [first, second] = [`re_first_${refundId.slice(0, 8)}`, `re_second_${refundId.slice(0, 8)}`];
      await t.db.query(`UPDATE refunds SET provider_refund_id = $2 WHERE id = $1`, [refundId, first]);
      const before = await metric('payments_late_landings_total', 'kind="second_refund",found_by="webhook"');
      const event = (providerRefundId: string) => ({
        type: 'refund.succeeded',
        timestamp: new Date().toISOString(),
        data: { ...charge.data, providerRefundId, refundId, amountMinor: 2500, status: 'succeeded' },
      });
      // The same confirmation again is no news.
      expect((await deliver(event(first))).body).toMatchObject({ outcome: 'no_effect', detail: 'already-settled: refund is succeeded' });
      expect((await deliver(event(second))).body).toMatchObject({ outcome: 'no_effect', detail: 'second-refund: alerted' });
      expect(await metric('payments_late_landings_total', 'kind="second_refund",found_by="webhook"')).toBe(before + 1);
      expect((await t.db.query(`SELECT status, provider_refund_id FROM refunds WHERE id = $1`, [refundId])).rows[0]).toEqual({
        status: 'succeeded',
        provider_refund_id: first,
      });
      expect(await payment(p.paymentId)).toMatchObject({ refunded_minor: '2500' });
    });
  });

  describe('recorded with no effect', () => {
    it('a failed charge of an unknown payment, an unknown type and an amount or currency that differs from ours: 200, recorded, nothing changed', async () => {
      const p = await orderWithPayment();
      const cases: [unknown, string][] = [
        // A failed charge of a payment we do not have moved no money (a succeeded one is refunded: lost-payments.e2e-spec).
        [chargeEvent('charge.failed', { ...p, paymentId: randomUUID() }), 'unknown-payment'],
        [{ type: 'dispute.created', timestamp: new Date().toISOString(), data: { paymentId: p.paymentId } }, 'unknown-type'],
        [chargeEvent('charge.succeeded', p, { amountMinor: 1 }), 'mismatch: amountMinor 1 ≠ ours 2500'],
        [chargeEvent('charge.succeeded', p, { currency: 'USD' }), 'mismatch: currency USD ≠ ours EUR'],
      ];
      for (const [event, detail] of cases) {
        const id = `msg_${randomUUID()}`;
        const res = await deliver(event, { id });
        expect(res.status).toBe(200);
        expect(res.body).toEqual({ webhookId: id, outcome: 'no_effect', detail });
        expect(await processed(id)).toEqual([expect.objectContaining({ outcome: 'no_effect', detail })]);
      }
      expect(await payment(p.paymentId)).toMatchObject({ status: 'pending' });
      expect(await order(p.orderId)).toMatchObject({ status: 'created', paid_events: 0 });
    });

    it('a correctly signed body that is not JSON or not an event: acknowledged (redelivery cannot fix it), recorded as malformed', async () => {
      for (const body of ['{not json', '[1,2]', JSON.stringify({ type: 'charge.succeeded', data: { paymentId: 'not-a-uuid' } })]) {
        const id = `msg_${randomUUID()}`;
        const res = await deliver(body, { id });
        expect(res.status).toBe(200);
        expect(res.body.outcome).toBe('no_effect');
        expect(await processed(id)).toEqual([
          expect.objectContaining({ outcome: 'no_effect', detail: expect.stringMatching(/^malformed: /) }),
        ]);
      }
    });
  });

  describe('rejected: 401 problem+json, nothing recorded', () => {
    const tenMinutes = 10 * 60 * 1000;
    const cases: [string, Delivery][] = [
      ['no signature header', { signature: () => undefined }],
      ['a signature made with another secret', { signature: () => 'v1,' + Buffer.alloc(32, 7).toString('base64') }],
      ['a signature of another body', { signature: () => 'v1,' + new Webhook(SECRET).sign('msg_other', new Date(), '{}').split(',')[1] }],
      ['signed more than 5 minutes ago (a replay)', { at: new Date(Date.now() - tenMinutes) }],
      ['dated more than 5 minutes ahead', { at: new Date(Date.now() + tenMinutes) }],
    ];
    it.each(cases)('%s', async (_name, delivery) => {
      const p = await orderWithPayment();
      const id = `msg_${randomUUID()}`;
      const res = await deliver(chargeEvent('charge.succeeded', p), { ...delivery, id });
      expect(res.status).toBe(401);
      expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
      expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:webhook-signature-invalid', status: 401 });
      expect(await processed(id)).toHaveLength(0);
      expect(await payment(p.paymentId)).toMatchObject({ status: 'pending' });
    });

    it('the body changed by one byte after signing', async () => {
      const p = await orderWithPayment();
      const id = `msg_${randomUUID()}`;
      const body = JSON.stringify(chargeEvent('charge.succeeded', p));
      const at = new Date();
      const res = await request(t.url)
        .post('/webhooks/psp')
        .set('Content-Type', 'application/json')
        .set('webhook-id', id)
        .set('webhook-timestamp', String(Math.floor(at.getTime() / 1000)))
        .set('webhook-signature', signer.sign(id, at, body))
        .send(body.replace('"amountMinor":2500', '"amountMinor": 2500'));
      expect(res.status).toBe(401);
      expect(await processed(id)).toHaveLength(0);
    });

    /** Standard Webhooks' v1 signature over exact bytes, computed here with node:crypto. */
    const hmacOf = (id: string, timestamp: string, body: Buffer) =>
      'v1,' +
      createHmac('sha256', Buffer.from(SECRET.slice('whsec_'.length), 'base64'))
        .update(`${id}.${timestamp}.`)
        .update(body)
        .digest('base64');

    it('a body that differs from the signed one in a byte that is not UTF-8 (0xFE for 0xFF)', async () => {
      const p = await orderWithPayment();
      const id = `msg_${randomUUID()}`;
      const json = JSON.stringify(chargeEvent('charge.succeeded', p));
      const bodyWith = (byte: number) =>
        Buffer.concat([Buffer.from(json.slice(0, -1) + ',"note":"'), Buffer.from([byte]), Buffer.from('"}')]);
      const timestamp = String(Math.floor(Date.now() / 1000));
      const res = await request(t.url)
        .post('/webhooks/psp')
        .set('Content-Type', 'application/json')
        .set('webhook-id', id)
        .set('webhook-timestamp', timestamp)
        // What a signer that decodes the body as UTF-8 first signs for the 0xFF body: 0xFF became U+FFFD, as 0xFE does.
        .set('webhook-signature', hmacOf(id, timestamp, Buffer.from(bodyWith(0xff).toString('utf8'))))
        .send(bodyWith(0xfe));
      expect(res.status).toBe(401);
      expect(await processed(id)).toHaveLength(0);
      expect(await payment(p.paymentId)).toMatchObject({ status: 'pending' });
    });

    it('a timestamp that is not whole seconds alone ("<now>junk"), signed as the number before the junk', async () => {
      const p = await orderWithPayment();
      const id = `msg_${randomUUID()}`;
      const body = Buffer.from(JSON.stringify(chargeEvent('charge.succeeded', p)));
      const now = String(Math.floor(Date.now() / 1000));
      const res = await request(t.url)
        .post('/webhooks/psp')
        .set('Content-Type', 'application/json')
        .set('webhook-id', id)
        .set('webhook-timestamp', `${now}junk`)
        .set('webhook-signature', hmacOf(id, now, body))
        .send(body);
      expect(res.status).toBe(401);
      expect(await processed(id)).toHaveLength(0);
    });

    it('secret rotation: two signatures in the header, only one valid → accepted', async () => {
      const p = await orderWithPayment();
      const id = `msg_${randomUUID()}`;
      const event = JSON.stringify(chargeEvent('charge.succeeded', p));
      const stale = new Webhook(OTHER_SECRET).sign(id, new Date(), event);
      const res = await deliver(event, { id, signature: (valid) => `${stale} ${valid}` });
      expect(res.status).toBe(200);
      expect(res.body.outcome).toBe('applied');
      expect(await order(p.orderId)).toMatchObject({ status: 'paid', paid_events: 1 });
    });

    it('counts received, rejected, duplicate and applied in /metrics', async () => {
      const before = {
        rejected: await metric('webhook_events_total', 'outcome="rejected"'),
        duplicate: await metric('webhook_events_total', 'outcome="duplicate"'),
      };
      const p = await orderWithPayment();
      const id = `msg_${randomUUID()}`;
      await deliver(chargeEvent('charge.succeeded', p), { id, signature: () => 'v1,AAAA' });
      await deliver(chargeEvent('charge.succeeded', p), { id });
      await deliver(chargeEvent('charge.succeeded', p), { id });
      expect(await metric('webhook_events_total', 'outcome="rejected"')).toBe(before.rejected + 1);
      expect(await metric('webhook_events_total', 'outcome="duplicate"')).toBe(before.duplicate + 1);
      expect(await metric('webhook_events_total', 'outcome="received"')).toBeGreaterThanOrEqual(3);
      expect(await metric('webhook_events_total', 'outcome="applied"')).toBeGreaterThanOrEqual(1);
      expect(await processed(id)).toEqual([expect.objectContaining({ outcome: 'applied' })]);
    });
  });

  it('a database error mid-handler: 503, nothing recorded, the order untouched; the redelivery then applies once', async () => {
    const p = await orderWithPayment();
    // A real failure inside the effect's transaction: the payment's UPDATE raises, once.
    await t.db.query(`CREATE SEQUENCE IF NOT EXISTS webhook_fault_seq`);
    await t.db.query(`
      CREATE OR REPLACE FUNCTION webhook_fault() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF NEW.id = '${p.paymentId}' AND nextval('webhook_fault_seq') = 1 THEN RAISE EXCEPTION 'injected fault'; END IF;
        RETURN NEW;
      END $$`);
    await t.db.query(`CREATE TRIGGER webhook_fault BEFORE UPDATE ON payments FOR EACH ROW EXECUTE FUNCTION webhook_fault()`);
    try {
      const id = `msg_${randomUUID()}`;
      const event = chargeEvent('charge.succeeded', p);
      const failed = await deliver(event, { id });
      expect(failed.status).toBe(503);
      expect(failed.headers['content-type']).toMatch(PROBLEM_JSON);
      expect(failed.body).toMatchObject({ type: 'urn:idempotent-orders:problem:webhook-not-processed', webhookId: id });
      expect(await processed(id)).toHaveLength(0);
      expect(await payment(p.paymentId)).toMatchObject({ status: 'pending' });
      expect(await order(p.orderId)).toMatchObject({ status: 'created', paid_events: 0 });

      const redelivered = await deliver(event, { id });
      expect(redelivered.status).toBe(200);
      expect(redelivered.body.outcome).toBe('applied');
      expect(await processed(id)).toHaveLength(1);
      expect(await order(p.orderId)).toMatchObject({ status: 'paid', paid_events: 1 });
    } finally {
      await t.db.query(`DROP TRIGGER webhook_fault ON payments`);
    }
  });

  describe('a charge.succeeded for a payment we hold as failed (the provider charged late)', () => {
    let calls: { body: RefundRequest; key: string }[];
    let answer: () => PspCallResult<PspRefund>;
    let original: PspClient['createRefund'];

    beforeAll(() => {
      // The one stub in this file: the provider's refund endpoint (the real client is not wired into this branch).
      const psp = t.app.get(PspClient);
      original = psp.createRefund.bind(psp);
      psp.createRefund = (body, key) => {
        calls.push({ body, key });
        return Promise.resolve(answer());
      };
    });
    afterAll(() => {
      t.app.get(PspClient).createRefund = original;
    });
    beforeEach(() => {
      calls = [];
    });

    const refundOf = (body: RefundRequest, status: 'succeeded' | 'failed' = 'succeeded'): PspRefund => ({
      id: `re_${body.chargeId}`,
      status,
      chargeId: body.chargeId,
      amountMinor: body.amountMinor,
      failureCode: null,
      metadata: body.metadata,
      createdAt: new Date().toISOString(),
    });

    async function lateRefunds(paymentId: string) {
      return (
        await t.db.query(
          `SELECT id, charge_id, status, outbound_key, attempts, provider_refund_id FROM late_charge_refunds WHERE payment_id = $1`,
          [paymentId],
        )
      ).rows;
    }

    async function until<T>(what: () => Promise<T>, done: (v: T) => boolean): Promise<T> {
      const deadline = Date.now() + 10_000;
      for (;;) {
        const value = await what();
        if (done(value) || Date.now() > deadline) return value;
        await new Promise((r) => setTimeout(r, 50));
      }
    }

    it('is refunded once under late_<chargeId>, counted; a redelivery or a second event for the charge refunds nothing more; the payment stays failed', async () => {
      answer = () => ({ kind: 'succeeded', value: refundOf(calls[calls.length - 1].body) });
      const requestedBefore = await metric('payments_late_charge_refunds_total', 'outcome="requested"');
      const p = await orderWithPayment('failed');
      const event = chargeEvent('charge.succeeded', p);
      const id = `msg_${randomUUID()}`;
      const res = await deliver(event, { id });
      expect(res.status).toBe(200);
      expect(res.body).toMatchObject({ outcome: 'applied', detail: 'late-charge: refund requested' });
      const [row] = await until(
        () => lateRefunds(p.paymentId),
        (rows) => rows[0]?.status !== 'pending',
      );
      expect(row).toMatchObject({
        charge_id: event.data.chargeId,
        status: 'succeeded',
        outbound_key: `late_${event.data.chargeId}`,
        attempts: 1,
        provider_refund_id: `re_${event.data.chargeId}`,
      });
      expect(calls).toEqual([
        {
          key: `late_${event.data.chargeId}`,
          body: { chargeId: event.data.chargeId, amountMinor: 2500, metadata: { refundId: row.id, paymentId: p.paymentId } },
        },
      ]);

      expect((await deliver(event, { id })).body.outcome).toBe('duplicate');
      expect((await deliver(event)).body).toMatchObject({ outcome: 'no_effect', detail: 'late-charge: its refund was already requested' });
      expect(calls).toHaveLength(1);
      expect(await lateRefunds(p.paymentId)).toHaveLength(1);
      expect(await payment(p.paymentId)).toMatchObject({ status: 'failed' });
      expect(await order(p.orderId)).toMatchObject({ status: 'created', paid_events: 0 });
      expect(await metric('payments_late_charge_refunds_total', 'outcome="requested"')).toBe(requestedBefore + 1);
    });

    it('a second charge for a payment that succeeded with another charge is refunded too; the payment and order stay as they are', async () => {
      answer = () => ({ kind: 'succeeded', value: refundOf(calls[calls.length - 1].body) });
      const p = await orderWithPayment();
      expect((await deliver(chargeEvent('charge.succeeded', p))).body.outcome).toBe('applied');
      const second = chargeEvent('charge.succeeded', p, { chargeId: 'ch_second' });
      const res = await deliver(second);
      expect(res.body).toMatchObject({ outcome: 'applied', detail: 'second-charge: refund requested' });
      const [row] = await until(
        () => lateRefunds(p.paymentId),
        (rows) => rows[0]?.status !== 'pending',
      );
      expect(row).toMatchObject({ charge_id: 'ch_second', status: 'succeeded', outbound_key: 'late_ch_second' });
      expect(calls.map((c) => c.body.chargeId)).toEqual(['ch_second']);
      expect(await payment(p.paymentId)).toMatchObject({ status: 'succeeded', provider_transaction_id: `ch_${p.paymentId.slice(0, 8)}` });
      expect(await order(p.orderId)).toMatchObject({ status: 'paid', paid_events: 1 });
    });

    it('still unknown after LATE_REFUND_ALERT_ATTEMPTS attempts: alerted once at error, shown as overdue; still retried, never given up', async () => {
      answer = () => ({ kind: 'unknown', reason: 'timeout' });
      const p = await orderWithPayment('failed');
      expect((await deliver(chargeEvent('charge.succeeded', p))).body.outcome).toBe('applied');
      const [pending] = await until(
        () => lateRefunds(p.paymentId),
        (rows) => rows[0]?.attempts === 1 && calls.length === 1,
      );
      const error = jest.spyOn(Logger.prototype, 'error');
      try {
        const alerts = () =>
          error.mock.calls.filter(
            ([fields]) =>
              (fields as { lateRefundId?: string; alert?: boolean }).lateRefundId === pending.id && (fields as { alert?: boolean }).alert,
          );
        for (let attempts = 2; attempts <= LATE_REFUND_ALERT_ATTEMPTS + 1; attempts++) {
          await t.db.query(`UPDATE late_charge_refunds SET next_attempt_at = now() WHERE id = $1`, [pending.id]);
          // Due now: this call or the refunder's own tick (every 2 s) claims it, whichever comes first; either is one
          // attempt (the claim is a conditional UPDATE), so the test waits for that attempt to be recorded.
          await t.app.get(LateChargeRefunder).attempt(pending.id);
          await until(
            () => lateRefunds(p.paymentId),
            (rows) =>
              rows[0]?.attempts === attempts &&
              calls.length === attempts &&
              alerts().length === (attempts >= LATE_REFUND_ALERT_ATTEMPTS ? 1 : 0),
          );
          expect(alerts()).toHaveLength(attempts >= LATE_REFUND_ALERT_ATTEMPTS ? 1 : 0);
        }
        expect(await metric('payments_late_charge_refunds_pending', 'state="overdue"')).toBeGreaterThanOrEqual(1);
        const [row] = await lateRefunds(p.paymentId);
        expect(row).toMatchObject({ status: 'pending', attempts: LATE_REFUND_ALERT_ATTEMPTS + 1 });
        // Due again within the backoff, not given up.
        const { rows } = await t.db.query(
          `SELECT next_attempt_at > now() AND next_attempt_at <= now() + interval '10 minutes' AS scheduled FROM late_charge_refunds WHERE id = $1`,
          [pending.id],
        );
        expect(rows[0].scheduled).toBe(true);
      } finally {
        error.mockRestore();
      }
      // Settled so that the refunder's own tick leaves it alone for the tests after this one.
      await t.app.get(LateChargeRefunder).settle(pending.id, 'succeeded', `re_${pending.id.slice(0, 8)}`, null);
    });

    it('each unknown outcome schedules the next attempt at a doubling delay that grows to LATE_REFUND_RETRY_MAX_SECONDS, not capped at the claim', async () => {
      answer = () => ({ kind: 'unknown', reason: 'timeout' });
      const p = await orderWithPayment('failed');
      expect((await deliver(chargeEvent('charge.succeeded', p))).body.outcome).toBe('applied');
      const [pending] = await until(
        () => lateRefunds(p.paymentId),
        (rows) => rows[0]?.attempts === 1 && calls.length === 1,
      );
      // The first attempt (in the background) has recorded its unknown outcome once the claim's minute is cut short.
      await until(
        () =>
          t.db.query(`SELECT next_attempt_at < now() + interval '30 seconds' AS recorded FROM late_charge_refunds WHERE id = $1`, [
            pending.id,
          ]),
        (result) => result.rows[0].recorded === true,
      );
      const scheduledInSeconds = async () =>
        Number(
          (
            await t.db.query(`SELECT extract(epoch FROM next_attempt_at - now())::float8 AS s FROM late_charge_refunds WHERE id = $1`, [
              pending.id,
            ])
          ).rows[0].s,
        );
      const seen: [number, number][] = [];
      const expected: [number, number][] = [];
      for (let attempts = 1; attempts <= 9; attempts++) {
        if (attempts > 1) {
          await t.db.query(`UPDATE late_charge_refunds SET next_attempt_at = now() WHERE id = $1`, [pending.id]);
          expect([attempts, await t.app.get(LateChargeRefunder).attempt(pending.id)]).toEqual([attempts, true]);
        }
        // Whole seconds: the statements' clocks differ by the time between them, well under one.
        seen.push([attempts, Math.round(await scheduledInSeconds())]);
        expected.push([attempts, Math.min(LATE_REFUND_RETRY_MAX_SECONDS, LATE_REFUND_RETRY_FIRST_SECONDS * 2 ** (attempts - 1))]);
      }
      // 5, 10, 20, 40, 80, 160, 320, 600, 600 s.
      expect(seen).toEqual(expected);
      expect(expected[expected.length - 1][1]).toBe(LATE_REFUND_RETRY_MAX_SECONDS);
      await t.app.get(LateChargeRefunder).settle(pending.id, 'succeeded', `re_${pending.id.slice(0, 8)}`, null);
    });

    it('an unknown outcome leaves the refund pending; the retry uses the same outbound key, and the refund.succeeded webhook settles it too', async () => {
      answer = () => ({ kind: 'unknown', reason: 'timeout' });
      const p = await orderWithPayment('failed');
      const event = chargeEvent('charge.succeeded', p);
      expect((await deliver(event)).body.outcome).toBe('applied');
      const [pending] = await until(
        () => lateRefunds(p.paymentId),
        (rows) => rows[0]?.attempts === 1 && calls.length === 1,
      );
      expect(pending).toMatchObject({ status: 'pending', attempts: 1 });
      // Not due yet: the job leaves it alone.
      expect(await t.app.get(LateChargeRefunder).attempt(pending.id)).toBe(false);

      await t.db.query(`UPDATE late_charge_refunds SET next_attempt_at = now() WHERE id = $1`, [pending.id]);
      expect(await t.app.get(LateChargeRefunder).retryDue()).toBeGreaterThanOrEqual(1);
      expect(calls.map((c) => c.key)).toEqual([`late_${event.data.chargeId}`, `late_${event.data.chargeId}`]);
      expect((await lateRefunds(p.paymentId))[0]).toMatchObject({ status: 'pending', attempts: 2 });

      // The provider's webhook for that refund (metadata.refundId = our row) tells us it went through.
      const refundEvent = {
        type: 'refund.succeeded',
        timestamp: new Date().toISOString(),
        data: { ...event.data, providerRefundId: 're_late', refundId: pending.id, status: 'succeeded' },
      };
      const res = await deliver(refundEvent);
      expect(res.body).toMatchObject({ outcome: 'applied', detail: 'late-charge-refund-succeeded' });
      expect((await lateRefunds(p.paymentId))[0]).toMatchObject({ status: 'succeeded', provider_refund_id: 're_late' });
      expect(await payment(p.paymentId)).toMatchObject({ status: 'failed' });
    });
  });

  it('the OpenAPI document: no API key (security: []), the three signature headers, 200/400/401/503 with problem examples', async () => {
    const res = await request(t.url).get('/docs-json');
    expect(res.status).toBe(200);
    const op = res.body.paths['/webhooks/psp'].post;
    expect(op.tags).toEqual(['webhooks']);
    expect(op.security).toEqual([]);
    const headers = op.parameters
      .filter((p: { in: string }) => p.in === 'header')
      .map((p: { name: string; required: boolean }) => [p.name, p.required]);
    expect(headers.sort()).toEqual([
      ['webhook-id', true],
      ['webhook-signature', true],
      ['webhook-timestamp', true],
    ]);
    expect(Object.keys(op.responses)).toEqual(expect.arrayContaining(['200', '400', '401', '503']));
    expect(op.responses['401'].content['application/problem+json'].example.type).toBe(
      'urn:idempotent-orders:problem:webhook-signature-invalid',
    );
  });

  it('the reaper forgets processed events past their retention (30 days), and only those', async () => {
    const old = `msg_${randomUUID()}`;
    const recent = `msg_${randomUUID()}`;
    await t.db.query(
      `INSERT INTO processed_webhook_events (webhook_id, type, outcome, detail, received_at)
       VALUES ($1, 'charge.succeeded', 'applied', 'payment-succeeded', now() - interval '31 days'),
              ($2, 'charge.succeeded', 'applied', 'payment-succeeded', now() - interval '29 days')`,
      [old, recent],
    );
    expect(await t.app.get(ProcessedWebhookEventReaper).reapOldEvents()).toBeGreaterThanOrEqual(1);
    expect(await processed(old)).toHaveLength(0);
    expect(await processed(recent)).toHaveLength(1);
  });

  it('/metrics shows the age of the oldest pending payment and refund', async () => {
    await orderWithPayment();
    await t.db.query(
      `UPDATE payments SET created_at = now() - interval '1 hour' WHERE id = (SELECT id FROM payments WHERE status = 'pending' ORDER BY created_at LIMIT 1)`,
    );
    expect(await metric('payments_oldest_pending_seconds', 'kind="payment"')).toBeGreaterThanOrEqual(3600);
    expect(await metric('payments_oldest_pending_seconds', 'kind="refund"')).toBe(0);
  });
});
