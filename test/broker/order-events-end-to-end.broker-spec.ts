/**
 * Both halves of the broker case at once, as they run in production: the service's API changes orders, its relay
 * publishes their events from the outbox to RabbitMQ, and the fulfilment consumer (`npm run start:fulfilment`, its own
 * process and database) makes one shipment per paid order — while the consumer is SIGKILLed, when the relay dies
 * between the broker's confirm and its mark, so that the consumer receives an event twice, and when the broker loses
 * what it confirmed and the outbox sends it all again.
 */
import { randomUUID } from 'node:crypto';
import { resolve } from 'node:path';
import { Pool } from 'pg';
import request from 'supertest';
import { freePort } from '../../src/common/free-port';
import { type RabbitMq, startRabbitMq } from '../support/rabbitmq';
import { FULFILMENT_AUTH, FULFILMENT_TOKEN, runServiceToExit, type ServiceProcess, startServiceProcess } from '../support/service-process';
import { until } from '../support/until';
import { ALICE, bearer, createTestDatabase, ignoreIdleErrors, startTestApp, type TestApp, WEBHOOK_SECRET } from '../support/test-app';

const FULFILMENT = resolve(process.cwd(), 'dist/apps/fulfilment/src/main.js');
const QUEUE = 'fulfilment.order-events';
const DEAD = 'fulfilment.order-events.dead-letters';
const ORDERS = 500;
const WORKERS = 8;

describe('order events end to end: the API, the outbox relay, RabbitMQ, the fulfilment consumer', () => {
  let broker: RabbitMq;
  let orders: Awaited<ReturnType<typeof createTestDatabase>>;
  let fulfilment: Awaited<ReturnType<typeof createTestDatabase>>;
  let shipmentsDb: Pool;
  let service: TestApp | undefined;
  let consumer: ServiceProcess | undefined;

  const startConsumer = async () =>
    (consumer = await startServiceProcess(
      {
        DATABASE_URL: fulfilment.url,
        AMQP_URL: broker.url,
        PORT: String(await freePort()),
        FULFILMENT_PREFETCH: '10',
        FULFILMENT_API_TOKEN: FULFILMENT_TOKEN,
      },
      { main: FULFILMENT },
    ));
  const count = async (sql: string, params: unknown[] = []) => (await shipmentsDb.query<{ n: number }>(sql, params)).rows[0].n;
  const shipments = () => count(`SELECT count(*)::int AS n FROM fulfilment.shipments`);
  const outcomes = async (): Promise<Record<string, number>> => {
    const text = await (await fetch(`${consumer!.url}/metrics`, FULFILMENT_AUTH)).text();
    const counts: Record<string, number> = {};
    for (const [, outcome, value] of text.matchAll(/^idempotent_messages_total\{consumer="fulfilment",outcome="([a-z-]+)"\} (\d+)$/gm)) {
      counts[outcome] = Number(value);
    }
    return counts;
  };
  const createAndPay = async (url: string): Promise<string> => {
    const created = await request(url)
      .post('/orders')
      .set('Authorization', bearer(ALICE))
      .set('Idempotency-Key', randomUUID())
      .send({ currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 1_250 }] });
    expect(created.status).toBe(201);
    const orderId = (created.body as { id: string }).id;
    const paid = await request(url)
      .post(`/orders/${orderId}/payments`)
      .set('Authorization', bearer(ALICE))
      .set('Idempotency-Key', randomUUID())
      .send({ source: 'tok_visa' });
    expect(paid.status).toBe(201);
    return orderId;
  };

  beforeAll(async () => {
    [broker, orders, fulfilment] = await Promise.all([startRabbitMq(), createTestDatabase(), createTestDatabase({ empty: true })]);
    shipmentsDb = ignoreIdleErrors(new Pool({ connectionString: fulfilment.url, max: 2 }));
  }, 180_000);
  afterAll(async () => {
    await consumer?.kill('SIGKILL');
    await service?.close().catch(() => undefined);
    await shipmentsDb?.end();
    await fulfilment?.drop();
    await orders?.drop();
    await broker?.stop();
  }, 120_000);

  it(`${ORDERS} orders created and paid through the API while the consumer is SIGKILLed twice: ${ORDERS} shipments, none twice, every event sent, the queue drained`, async () => {
    service = await startTestApp(
      { AMQP_URL: broker.url, RECONCILE_INTERVAL_MS: '0', PSP_WEBHOOK_URL: 'none' },
      { databaseUrl: orders.url },
    );
    const api = service.url;
    await startConsumer();

    let made = 0;
    const paidOrders: string[] = [];
    const load = Promise.all(
      Array.from({ length: WORKERS }, async () => {
        while (made < ORDERS) {
          made++;
          paidOrders.push(await createAndPay(api));
        }
      }),
    );
    // Each kill lands mid-stream: after the consumer has committed shipments of its own, with deliveries in flight.
    const killedAt: number[] = [];
    for (let kill = 0; kill < 2; kill++) {
      const before = await shipments();
      await until('the consumer commits shipments', 60_000, async () => (await shipments()) > before);
      await consumer!.kill('SIGKILL');
      killedAt.push(await shipments());
      await startConsumer();
    }
    expect(killedAt[1]).toBeLessThan(ORDERS);
    await load;

    await until(`${ORDERS} shipments`, 120_000, async () => (await shipments()) === ORDERS);
    // Every event of the outbox was published and confirmed; the consumer's queue holds nothing, its dead letters none.
    await until(
      'the outbox sent',
      60_000,
      async () => (await service!.db.query(`SELECT count(*)::int AS n FROM order_events_outbox WHERE sent_at IS NULL`)).rows[0].n === 0,
    );
    await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 });
    expect(await broker.queueDepth(DEAD)).toEqual({ ready: 0, unacked: 0 });
    // One shipment per paid order (pending: paid, not cancelled), and one mark per event the outbox holds.
    const { rows } = await shipmentsDb.query<{ order_id: string }>(`SELECT order_id FROM fulfilment.shipments WHERE status = 'pending'`);
    expect(rows.map((r) => r.order_id).sort()).toEqual([...paidOrders].sort());
    const events = (await service.db.query(`SELECT count(*)::int AS n FROM order_events_outbox`)).rows[0].n as number;
    expect(events).toBe(2 * ORDERS);
    expect(await count(`SELECT count(*)::int AS n FROM fulfilment.processed_messages WHERE consumer = 'fulfilment'`)).toBe(events);
    await service.close();
    service = undefined;
  }, 420_000);

  it('the relay killed between the confirm and the mark: the consumer receives the event twice and applies it once', async () => {
    const off = await startTestApp({ RECONCILE_INTERVAL_MS: '0', PSP_WEBHOOK_URL: 'none' }, { databaseUrl: orders.url });
    let orderId: string;
    try {
      // Made with the relay off: its two events wait in the outbox for the relay that will die.
      orderId = await createAndPay(off.url);
    } finally {
      await off.close();
    }
    const before = await outcomes();

    // A relay that dies right after the broker confirmed what it published, before marking the rows sent.
    const dying = await runServiceToExit({
      PORT: '0',
      DATABASE_URL: orders.url,
      API_KEYS: `${ALICE.clientId}:${ALICE.secret}`,
      PSP_WEBHOOK_SECRET: WEBHOOK_SECRET,
      PSP_SANDBOX: 'in-process',
      LOG_LEVEL: 'error',
      AMQP_URL: broker.url,
      ORDER_EVENTS_LEASE_MS: '6000',
      ORDER_EVENTS_RELAY_FAULT: 'die-after-confirm',
    });
    expect(dying.output).toContain('die-after-confirm');
    await until(
      'the consumer applied the first copies',
      30_000,
      async () => (await count(`SELECT count(*)::int AS n FROM fulfilment.shipments WHERE order_id = $1`, [orderId])) === 1,
    );

    // The next relay takes the rows once the dead one's lease runs out and publishes them again.
    service = await startTestApp(
      { AMQP_URL: broker.url, RECONCILE_INTERVAL_MS: '0', PSP_WEBHOOK_URL: 'none' },
      { databaseUrl: orders.url },
    );
    await until(
      'the outbox sent',
      60_000,
      async () => (await service!.db.query(`SELECT count(*)::int AS n FROM order_events_outbox WHERE sent_at IS NULL`)).rows[0].n === 0,
    );
    await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 });
    const after = await outcomes();
    const grew = (outcome: string) => (after[outcome] ?? 0) - (before[outcome] ?? 0);
    // Two events (created, paid), each published at least once more: every extra copy found its mark.
    expect(grew('applied')).toBe(2);
    expect(grew('duplicate')).toBeGreaterThanOrEqual(1);
    expect(await count(`SELECT count(*)::int AS n FROM fulfilment.shipments WHERE order_id = $1 AND status = 'pending'`, [orderId])).toBe(
      1,
    );
  }, 180_000);

  it('events the broker confirmed and then lost (their queue gone): published again from the outbox by one UPDATE, each applied once, the copies of those already applied dropped by their marks', async () => {
    const api = service!.url;
    // The consumer away, so that what the relay publishes waits in the queue; the broker confirmed every event.
    await consumer!.kill('SIGKILL');
    const lostOrders: string[] = [];
    for (let i = 0; i < 20; i++) lostOrders.push(await createAndPay(api));
    await until(
      'the outbox sent',
      60_000,
      async () => (await service!.db.query(`SELECT count(*)::int AS n FROM order_events_outbox WHERE sent_at IS NULL`)).rows[0].n === 0,
    );
    await broker.untilQueueDepth(QUEUE, { ready: 40, unacked: 0 });
    // Lost by the broker after its confirms (as a RabbitMQ 3.10 node killed at the wrong moment can lose a quorum queue).
    await broker.deleteQueue(QUEUE);
    await startConsumer();
    await until('the consumer consumes its new queue', 30_000, async () => (await fetch(`${consumer!.url}/health`)).status === 200);
    const lost = () =>
      count(`SELECT count(*)::int AS n FROM fulfilment.shipments WHERE order_id = ANY($1::uuid[]) AND status = 'pending'`, [lostOrders]);
    expect(await lost()).toBe(0);
    const before = await outcomes();
    const events = (await service!.db.query(`SELECT count(*)::int AS n FROM order_events_outbox`)).rows[0].n as number;

    // The replay as an operator runs it (docs/patterns/message-consumer.md): every event since a time before the loss,
    // here all of them; the relay publishes them again.
    await service!.db.query(`UPDATE order_events_outbox SET sent_at = NULL WHERE created_at >= $1`, [new Date(0)]);

    await until('the lost orders shipped', 120_000, async () => (await lost()) === lostOrders.length);
    await until(
      'the outbox sent again',
      60_000,
      async () => (await service!.db.query(`SELECT count(*)::int AS n FROM order_events_outbox WHERE sent_at IS NULL`)).rows[0].n === 0,
    );
    await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 }, 60_000);
    const after = await outcomes();
    const grew = (outcome: string) => (after[outcome] ?? 0) - (before[outcome] ?? 0);
    expect(grew('applied')).toBe(2 * lostOrders.length);
    expect(grew('duplicate')).toBe(events - 2 * lostOrders.length);
    expect(await count(`SELECT count(*)::int AS n FROM fulfilment.processed_messages WHERE consumer = 'fulfilment'`)).toBe(events);
    expect(await count(`SELECT count(*)::int AS n FROM fulfilment.shipments WHERE status = 'pending'`)).toBe(
      ORDERS + 1 + lostOrders.length,
    );
    expect(await broker.queueDepth(DEAD)).toEqual({ ready: 0, unacked: 0 });
  }, 240_000);
});
