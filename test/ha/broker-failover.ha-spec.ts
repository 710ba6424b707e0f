/**
 * The broker side of issue 40: the service (dist/src/main.js) and the fulfilment consumer, each given all three nodes
 * of a RabbitMQ cluster in AMQP_URL, as production runs them. Orders are created and paid through the API while the
 * node leading the consumer's quorum queue is killed: the relay and the consumer move on to a survivor, every event
 * of the outbox is sent, every paid order makes one shipment, and no event is applied twice.
 */
import { randomUUID } from 'node:crypto';
import { resolve } from 'node:path';
import { Pool } from 'pg';
import { freePort } from '../../src/common/free-port';
import { type RabbitCluster, startRabbitCluster } from '../support/ha-rabbitmq';
import { FULFILMENT_AUTH, FULFILMENT_TOKEN, type ServiceProcess, startServiceProcess } from '../support/service-process';
import { ALICE, bearer, createTestDatabase, ignoreIdleErrors } from '../support/test-app';
import { until } from '../support/until';

const FULFILMENT = resolve(process.cwd(), 'dist/apps/fulfilment/src/main.js');
const QUEUE = 'fulfilment.order-events';
const ORDERS = 300;
const WORKERS = 6;
/** The kill lands mid-stream: the consumer applying, most of the orders still to come (the consumer lags the API). */
const MADE_BEFORE_KILL = ORDERS / 3;
const SHIPPED_BEFORE_KILL = 10;

describe('the service and the fulfilment consumer on a three-node RabbitMQ cluster: the queue leader node is killed under load', () => {
  let cluster: RabbitCluster | undefined;
  let orders: Awaited<ReturnType<typeof createTestDatabase>> | undefined;
  let fulfilment: Awaited<ReturnType<typeof createTestDatabase>> | undefined;
  let ordersDb: Pool | undefined;
  let shipmentsDb: Pool | undefined;
  let service: ServiceProcess | undefined;
  let consumer: ServiceProcess | undefined;

  afterAll(async () => {
    await consumer?.kill('SIGKILL');
    await service?.kill('SIGKILL');
    await shipmentsDb?.end();
    await ordersDb?.end();
    await fulfilment?.drop();
    await orders?.drop();
    await cluster?.stop();
  }, 120_000);

  it(`${ORDERS} orders created and paid: every event sent, one shipment per paid order, no event applied twice, both back on survivors`, async () => {
    [cluster, orders, fulfilment] = await Promise.all([startRabbitCluster(), createTestDatabase(), createTestDatabase({ empty: true })]);
    ordersDb = ignoreIdleErrors(new Pool({ connectionString: orders.url, max: 2 }));
    shipmentsDb = ignoreIdleErrors(new Pool({ connectionString: fulfilment.url, max: 2 }));
    const count = async (db: Pool, sql: string, params: unknown[] = []) => (await db.query<{ n: number }>(sql, params)).rows[0].n;
    const shipments = () => count(shipmentsDb!, `SELECT count(*)::int AS n FROM fulfilment.shipments`);
    const unsent = () => count(ordersDb!, `SELECT count(*)::int AS n FROM order_events_outbox WHERE sent_at IS NULL`);

    [service, consumer] = await Promise.all([
      startServiceProcess({
        DATABASE_URL: orders.url,
        API_KEYS: `${ALICE.clientId}:${ALICE.secret}`,
        AMQP_URL: cluster.urlList,
        PSP_WEBHOOK_URL: 'none',
        RECONCILE_INTERVAL_MS: '0',
      }),
      startServiceProcess(
        {
          DATABASE_URL: fulfilment.url,
          AMQP_URL: cluster.urlList,
          PORT: String(await freePort()),
          FULFILMENT_PREFETCH: '10',
          FULFILMENT_API_TOKEN: FULFILMENT_TOKEN,
        },
        { main: FULFILMENT },
      ),
    ]);
    const relayState = async () =>
      ((await (await fetch(`${service!.url}/health`)).json()) as { orderEventsRelay: string }).orderEventsRelay;
    const consumerHealthy = async () => (await fetch(`${consumer!.url}/health`).catch(() => undefined))?.status === 200;
    await until('the consumer consumes its queue', 30_000, consumerHealthy, 100);
    await until('the relay is connected', 30_000, async () => (await relayState()) === 'connected', 100);

    // Asked before the load: the CLI takes seconds here, and the leader stays put until its node goes.
    const leader = await cluster.queueLeader(QUEUE);

    const post = async (path: string, body: unknown) => {
      const res = await fetch(`${service!.url}${path}`, {
        method: 'POST',
        headers: { authorization: bearer(ALICE), 'idempotency-key': randomUUID(), 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      expect(res.status).toBe(201);
      return (await res.json()) as { id: string };
    };
    let made = 0;
    const paidOrders: string[] = [];
    const load = Promise.all(
      Array.from({ length: WORKERS }, async () => {
        while (made < ORDERS) {
          made++;
          const { id } = await post('/orders', { currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 1_250 }] });
          await post(`/orders/${id}/payments`, { source: 'tok_visa' });
          paidOrders.push(id);
        }
      }),
    );

    await until(
      'orders made and shipments committed before the kill',
      60_000,
      async () => made >= MADE_BEFORE_KILL && (await shipments()) >= SHIPPED_BEFORE_KILL,
      50,
    );
    const madeAtKill = made;
    const killedAt = new Date();
    await cluster.killNode(leader);
    // Resumed, measured by events made after the kill (nothing in flight before it can count): the relay has sent
    // one and says connected; the consumer has marked one and its /health is 200 (connection up, consumer held).
    const resumed: { relayMs?: number; consumerMs?: number } = {};
    await until(
      'the relay and the consumer resumed on survivors',
      60_000,
      async () => {
        const { rows: sent } = await ordersDb!.query<{ event_id: string }>(
          `SELECT event_id FROM order_events_outbox WHERE created_at > $1 AND sent_at IS NOT NULL`,
          [killedAt],
        );
        if (resumed.relayMs === undefined && sent.length > 0 && (await relayState()) === 'connected')
          resumed.relayMs = Date.now() - killedAt.getTime();
        const marked = () =>
          count(shipmentsDb!, `SELECT count(*)::int AS n FROM fulfilment.processed_messages WHERE message_id = ANY($1::text[])`, [
            sent.map((r) => r.event_id),
          ]);
        if (resumed.consumerMs === undefined && sent.length > 0 && (await marked()) > 0 && (await consumerHealthy()))
          resumed.consumerMs = Date.now() - killedAt.getTime();
        return resumed.relayMs !== undefined && resumed.consumerMs !== undefined;
      },
      50,
    );
    await load;
    expect(madeAtKill).toBeLessThan(ORDERS);
    // Both were on the killed node (each connects to the first URL it can; the queue's leader is where it was declared).
    expect(service.output()).toContain('order events relay lost RabbitMQ');
    expect(consumer.output()).toContain(`consumer of ${QUEUE} lost`);
    const newLeader = await cluster.queueLeader(QUEUE);
    expect(newLeader).not.toBe(leader);

    await until(`${ORDERS} shipments`, 60_000, async () => (await shipments()) === ORDERS, 100);
    await until('the outbox sent', 60_000, async () => (await unsent()) === 0, 100);
    await until(
      'the queue drained',
      60_000,
      async () => {
        const depth = await cluster!.queueDepth(QUEUE);
        return depth.ready === 0 && depth.unacked === 0;
      },
      250,
    );
    const events = await count(ordersDb, `SELECT count(*)::int AS n FROM order_events_outbox`);
    expect(events).toBe(2 * ORDERS);
    // One shipment per paid order; one mark per event; each event applied once (a copy counts as a duplicate).
    const { rows } = await shipmentsDb.query<{ order_id: string }>(`SELECT order_id FROM fulfilment.shipments WHERE status = 'pending'`);
    expect(rows.map((r) => r.order_id).sort()).toEqual([...paidOrders].sort());
    expect(await count(shipmentsDb, `SELECT count(*)::int AS n FROM fulfilment.processed_messages WHERE consumer = 'fulfilment'`)).toBe(
      events,
    );
    const metrics = await (await fetch(`${consumer.url}/metrics`, FULFILMENT_AUTH)).text();
    const outcome = (name: string) =>
      Number(new RegExp(`^idempotent_messages_total\\{consumer="fulfilment",outcome="${name}"\\} (\\d+)$`, 'm').exec(metrics)?.[1] ?? 0);
    // An effect committed whose ack the lost channel refused is not counted applied: its redelivery is the duplicate.
    expect(outcome('applied')).toBeLessThanOrEqual(events);
    expect(outcome('applied') + outcome('duplicate')).toBeGreaterThanOrEqual(events);
    expect(await consumerHealthy()).toBe(true);
    expect(await relayState()).toBe('connected');
    console.log(
      `rabbitmq failover under load: queue leader node ${leader + 1} killed after ${madeAtKill}/${ORDERS} orders, leader now node ${newLeader + 1}; ` +
        `relay publishing again ${resumed.relayMs} ms and consumer applying again ${resumed.consumerMs} ms after the kill; ` +
        `${outcome('duplicate')} duplicate deliveries dropped by their marks`,
    );
  }, 180_000);
});
