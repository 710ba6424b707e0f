import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { Webhook } from 'standardwebhooks';
import { ProviderChargeSweep } from '../src/payments/provider-charge-sweep';
import { ALICE, bearer, PSP_AUTH, startTestApp, type TestApp } from './support/test-app';
import { until } from './support/until';

const SECRET = `whsec_${Buffer.from('lost-payments-e2e-secret-32-byte').toString('base64')}`;
const signer = new Webhook(SECRET);

interface Paid {
  orderId: string;
  paymentId: string;
  chargeId: string;
}

/**
 * Money at the provider for a payment our database does not have — what an asynchronous failover leaves behind when it
 * loses the last commits (test/ha/service-failover.ha-spec.ts does that for real). Here the loss is made by deleting
 * our rows of a paid order, the sandbox's ledger untouched; then the provider's webhook, or the sweep of its recent
 * charges, must find the charge, refund it once, and void the order if it is gone too.
 */
describe('lost payments: a charge the provider made for a payment our database does not have', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp({
      PSP_WEBHOOK_SECRET: SECRET,
      // Webhooks are delivered by the test, after the loss; the jobs are run by the test.
      PSP_WEBHOOK_URL: 'none',
      RECONCILE_INTERVAL_MS: '0',
      PROVIDER_SWEEP_INTERVAL_MS: '0',
    });
  });
  afterAll(() => t?.close());

  async function paidOrder(): Promise<Paid> {
    const created = await request(t.url)
      .post('/orders')
      .set('Authorization', bearer(ALICE))
      .set('Idempotency-Key', randomUUID())
      .send({ orderNumber: `LOST-${randomUUID()}`, currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 2500 }] });
    expect(created.status).toBe(201);
    const paid = await request(t.url)
      .post(`/orders/${created.body.id}/payments`)
      .set('Authorization', bearer(ALICE))
      .set('Idempotency-Key', randomUUID())
      .send({ source: 'tok_visa' });
    expect(paid.status).toBe(201);
    return { orderId: created.body.id, paymentId: paid.body.id, chargeId: paid.body.providerTransactionId };
  }

  /** What a failover that lost the last commits leaves: no payment; with `order: 'lost'` no order either. */
  async function lose(p: Paid, order: 'lost' | 'unpaid') {
    await t.db.query(`DELETE FROM payments WHERE id = $1`, [p.paymentId]);
    if (order === 'lost') {
      await t.db.query(`DELETE FROM order_events_outbox WHERE order_id = $1`, [p.orderId]);
      await t.db.query(`DELETE FROM orders WHERE id = $1`, [p.orderId]);
    } else {
      await t.db.query(`DELETE FROM order_events_outbox WHERE order_id = $1 AND type = 'order.paid'`, [p.orderId]);
      await t.db.query(`DELETE FROM order_events WHERE order_id = $1`, [p.orderId]);
      await t.db.query(`UPDATE orders SET status = 'created', version = 1 WHERE id = $1`, [p.orderId]);
    }
  }

  /** The charge's webhook as the provider sends it: `data.deploymentId` is what the charge was made with. */
  async function deliverChargeSucceeded(p: Paid, sentDeploymentId?: unknown) {
    const [charge] = (
      await t.db.query<{ deployment_id: string | null }>(`SELECT deployment_id FROM psp.charges WHERE id = $1`, [p.chargeId])
    ).rows;
    const deploymentId = sentDeploymentId ?? charge.deployment_id ?? undefined;
    const id = `msg_${randomUUID()}`;
    const at = new Date();
    const body = JSON.stringify({
      type: 'charge.succeeded',
      timestamp: at.toISOString(),
      data: {
        chargeId: p.chargeId,
        paymentId: p.paymentId,
        orderId: p.orderId,
        amountMinor: 2500,
        currency: 'EUR',
        status: 'succeeded',
        failureCode: null,
        ...(deploymentId === undefined ? {} : { deploymentId }),
      },
    });
    return request(t.url)
      .post('/webhooks/psp')
      .set('Content-Type', 'application/json')
      .set('webhook-id', id)
      .set('webhook-timestamp', String(Math.floor(at.getTime() / 1000)))
      .set('webhook-signature', signer.sign(id, at, body))
      .send(body);
  }

  async function metric(name: string, labels: string): Promise<number> {
    const res = await request(t.url).get('/metrics');
    const line = res.text.split('\n').find((l) => l.startsWith(`${name}{${labels}}`));
    return line ? Number(line.split(' ').pop()) : 0;
  }

  /** The provider's refunds of the charge, once the refunder's call has landed. */
  async function providerRefunds(chargeId: string, count = 1) {
    await until(`${count} refund(s) of ${chargeId} at the provider`, 15_000, async () => {
      const { rows } = await t.db.query(`SELECT 1 FROM psp.refunds WHERE charge_id = $1 AND status = 'succeeded'`, [chargeId]);
      return rows.length >= count;
    });
    const { rows } = await t.db.query<{ amount_minor: string }>(`SELECT amount_minor FROM psp.refunds WHERE charge_id = $1`, [chargeId]);
    return rows.map((r) => Number(r.amount_minor));
  }

  async function lateRefundOf(chargeId: string) {
    await until(`the late refund of ${chargeId} settled`, 15_000, async () => {
      const { rows } = await t.db.query(`SELECT 1 FROM late_charge_refunds WHERE charge_id = $1 AND status <> 'pending'`, [chargeId]);
      return rows.length === 1;
    });
    const { rows } = await t.db.query(
      `SELECT payment_id, lost_payment_id, status, amount_minor::int FROM late_charge_refunds WHERE charge_id = $1`,
      [chargeId],
    );
    return rows;
  }

  const voidedEvents = async (orderId: string) =>
    (await t.db.query(`SELECT type, order_version, payload FROM order_events_outbox WHERE order_id = $1`, [orderId])).rows;

  it('the webhook of a lost payment whose order is gone too: the charge refunded once, order.voided written once', async () => {
    const p = await paidOrder();
    await lose(p, 'lost');
    const before = await metric('payments_late_landings_total', 'kind="charge_of_lost_payment",found_by="webhook"');

    const first = await deliverChargeSucceeded(p);
    expect(first.status).toBe(200);
    expect(first.body).toMatchObject({ outcome: 'applied', detail: 'unknown-payment: refund requested' });
    // The same charge again, under another webhook id (a provider resends it): nothing more.
    const again = await deliverChargeSucceeded(p);
    expect(again.body).toMatchObject({ outcome: 'no_effect', detail: 'unknown-payment: its refund was already requested' });

    expect(await providerRefunds(p.chargeId)).toEqual([2500]);
    expect(await lateRefundOf(p.chargeId)).toEqual([
      { payment_id: null, lost_payment_id: p.paymentId, status: 'succeeded', amount_minor: 2500 },
    ]);
    expect(await voidedEvents(p.orderId)).toEqual([
      {
        type: 'order.voided',
        order_version: 2 ** 31 - 1,
        payload: expect.objectContaining({ type: 'order.voided', orderId: p.orderId, totalMinor: 2500, currency: 'EUR' }),
      },
    ]);
    expect(await metric('payments_late_landings_total', 'kind="charge_of_lost_payment",found_by="webhook"')).toBe(before + 1);
    expect(await metric('payments_lost_payment_orders_total', 'repair="voided"')).toBeGreaterThanOrEqual(1);
  });

  it('the sweep of recent charges finds a lost payment whose webhook never came: refunded once, whichever instance sweeps', async () => {
    const p = await paidOrder();
    const kept = await paidOrder();
    await lose(p, 'lost');
    const sweep = t.app.get(ProviderChargeSweep);
    // Two instances on the database sweep at once: one repair between them.
    const other = await startTestApp(
      { PSP_WEBHOOK_SECRET: SECRET, PSP_WEBHOOK_URL: 'none', RECONCILE_INTERVAL_MS: '0', PROVIDER_SWEEP_INTERVAL_MS: '0' },
      { databaseUrl: t.databaseUrl },
    );
    try {
      const repaired = await Promise.all([sweep.sweep(), other.app.get(ProviderChargeSweep).sweep()]);
      expect(repaired.sort()).toEqual([0, 1]);
    } finally {
      await other.close();
    }
    expect(await providerRefunds(p.chargeId)).toEqual([2500]);
    expect(await lateRefundOf(p.chargeId)).toEqual([
      { payment_id: null, lost_payment_id: p.paymentId, status: 'succeeded', amount_minor: 2500 },
    ]);
    expect((await voidedEvents(p.orderId)).map((e) => e.type)).toEqual(['order.voided']);
    // A later run finds nothing new; the payment we still have is never touched.
    expect(await sweep.sweep()).toBe(0);
    expect((await t.db.query(`SELECT 1 FROM psp.refunds WHERE charge_id = $1`, [kept.chargeId])).rows).toEqual([]);
    expect((await t.db.query(`SELECT status FROM orders WHERE id = $1`, [kept.orderId])).rows).toEqual([{ status: 'paid' }]);
  });

  it('a lost payment whose order is still here and unpaid: refunded, not voided, alerted for a person', async () => {
    const p = await paidOrder();
    await lose(p, 'unpaid');
    const before = await metric('payments_lost_payment_orders_total', 'repair="alerted"');
    expect((await deliverChargeSucceeded(p)).body).toMatchObject({ outcome: 'applied', detail: 'unknown-payment: refund requested' });
    expect(await providerRefunds(p.chargeId)).toEqual([2500]);
    expect((await voidedEvents(p.orderId)).map((e) => e.type)).toEqual(['order.created']);
    expect(await metric('payments_lost_payment_orders_total', 'repair="alerted"')).toBe(before + 1);
  });

  it("another deployment's charges on the same provider account, and charges with no deployment at all, are never taken for lost payments", async () => {
    // What a second deployment (or another service) sharing the account makes: a charge for a payment we never had.
    const charge = async (deploymentId?: string): Promise<Paid> => {
      const p = { orderId: randomUUID(), paymentId: randomUUID() };
      const res = await request(t.url)
        .post('/psp/charges')
        .set('Authorization', PSP_AUTH)
        .set('Idempotency-Key', randomUUID())
        .send({ amountMinor: 2500, currency: 'EUR', source: 'tok_visa', metadata: { ...p, ...(deploymentId ? { deploymentId } : {}) } });
      expect([res.status, res.body.detail]).toEqual([201, undefined]);
      return { ...p, chargeId: res.body.id };
    };
    const notOurs = (body: unknown) =>
      expect(body).toMatchObject({ outcome: 'no_effect', detail: expect.stringMatching(/^unknown-payment: not this deployment's charge/) });
    const untagged = await charge();
    notOurs((await deliverChargeSucceeded(untagged)).body);
    // Whatever another's says, it is not ours, and it is recorded (a NUL would fail the row's text column) without an echo.
    for (const odd of ['\u0000', { nested: true }, 'x'.repeat(1000)]) notOurs((await deliverChargeSucceeded(untagged, odd)).body);
    const theirTag = randomUUID();
    const theirs = await charge(theirTag);
    notOurs((await deliverChargeSucceeded(theirs)).body);
    const ours = await paidOrder();
    await lose(ours, 'lost');
    // The sweep repairs ours alone.
    expect(await t.app.get(ProviderChargeSweep).sweep()).toBe(1);
    expect(await providerRefunds(ours.chargeId)).toEqual([2500]);
    const refunded = await t.db.query(`SELECT charge_id FROM psp.refunds WHERE charge_id = ANY($1)`, [
      [theirs.chargeId, untagged.chargeId],
    ]);
    expect(refunded.rows).toEqual([]);
    expect(
      (await t.db.query(`SELECT 1 FROM late_charge_refunds WHERE charge_id = ANY($1)`, [[theirs.chargeId, untagged.chargeId]])).rows,
    ).toEqual([]);
  });
});
