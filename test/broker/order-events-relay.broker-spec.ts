import { type AmqpConnectionManager, type ChannelWrapper, connect } from 'amqp-connection-manager';
import type { ConfirmChannel, ConsumeMessage } from 'amqplib';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { randomUUID } from 'node:crypto';
import { resolve } from 'node:path';
import { Pool } from 'pg';
import request from 'supertest';
import { startRabbitMq, type RabbitMq } from '../support/rabbitmq';
import {
  ALICE,
  BOB,
  bearer,
  createTestDatabase,
  ignoreIdleErrors,
  PSP_KEY,
  startTestApp,
  type TestApp,
  WEBHOOK_SECRET,
} from '../support/test-app';

/**
 * The order events relay against a real RabbitMQ (Debian's rabbitmq-server, started by the harness): what reaches a
 * queue bound to orders.events is compared with the outbox, message by message.
 */

const EXCHANGE = 'orders.events';
const SETTLE_DEADLINE_MS = 45_000;

interface Received {
  messageId: string;
  routingKey: string;
  properties: ConsumeMessage['properties'];
  body: Record<string, unknown>;
}

/** A durable queue bound to the exchange with `order.*`, consumed with acks; it survives a broker restart and reconnects after one. */
async function bindTestQueue(url: string): Promise<{ received: Received[]; close(): Promise<void> }> {
  const queue = `test.order-events.${randomUUID()}`;
  const received: Received[] = [];
  const connection: AmqpConnectionManager = connect([url], { reconnectTimeInSeconds: 0.5 });
  const channel: ChannelWrapper = connection.createChannel({
    setup: async (ch: ConfirmChannel) => {
      await ch.assertExchange(EXCHANGE, 'topic', { durable: true });
      await ch.assertQueue(queue, { durable: true });
      await ch.bindQueue(queue, EXCHANGE, 'order.*');
      await ch.consume(queue, (message) => {
        if (!message) return;
        received.push({
          messageId: message.properties.messageId as string,
          routingKey: message.fields.routingKey,
          properties: message.properties,
          body: JSON.parse(message.content.toString()) as Record<string, unknown>,
        });
        ch.ack(message);
      });
    },
  });
  await channel.waitForConnect();
  return {
    received,
    close: async () => {
      await channel.close().catch(() => undefined);
      await connection.close().catch(() => undefined);
    },
  };
}

async function until(what: string, done: () => Promise<boolean> | boolean, deadlineMs = SETTLE_DEADLINE_MS): Promise<void> {
  const deadline = Date.now() + deadlineMs;
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`not within ${deadlineMs} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

interface OutboxRow {
  event_id: string;
  type: string;
  payload: Record<string, unknown>;
  sent_at: Date | null;
  attempts: number;
}

describe('order events relay → RabbitMQ', () => {
  let broker: RabbitMq;
  const cleanups: (() => Promise<unknown>)[] = [];
  let numbers = 0;

  beforeAll(async () => {
    broker = await startRabbitMq();
  }, 90_000);
  afterEach(async () => {
    // Newest first: apps before the database they run on.
    for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
  });
  afterAll(async () => {
    await broker?.stop();
  }, 60_000);

  async function app(env: Record<string, string>, databaseUrl?: string): Promise<TestApp> {
    const started = await startTestApp({ RECONCILE_INTERVAL_MS: '0', PSP_WEBHOOK_URL: 'none', ...env }, { databaseUrl });
    cleanups.push(() => started.close());
    return started;
  }
  async function database(): Promise<string> {
    const db = await createTestDatabase();
    cleanups.push(() => db.drop());
    return db.url;
  }
  async function testQueue() {
    const queue = await bindTestQueue(broker.url);
    cleanups.push(() => queue.close());
    return queue;
  }
  const create = (t: TestApp, client = ALICE) =>
    request(t.url)
      .post('/orders')
      .set('Authorization', bearer(client))
      .set('Idempotency-Key', randomUUID())
      .send({ orderNumber: `RELAY-${++numbers}`, currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 990 }] });
  const outbox = async (t: TestApp): Promise<OutboxRow[]> =>
    (await t.db.query<OutboxRow>(`SELECT event_id, type, payload, sent_at, attempts FROM order_events_outbox ORDER BY created_at`)).rows;
  const unsent = async (t: TestApp) =>
    (await t.db.query(`SELECT count(*)::int AS n FROM order_events_outbox WHERE sent_at IS NULL`)).rows[0].n as number;

  it('publishes each event once, as the contract says, and marks it sent after the confirm; /health says connected', async () => {
    const queue = await testQueue();
    const t = await app({ AMQP_URL: broker.url });
    await until('relay connected', async () => (await request(t.url).get('/health')).body.orderEventsRelay === 'connected');
    const orders = await Promise.all(Array.from({ length: 30 }, (_, i) => create(t, i % 2 ? ALICE : BOB)));
    expect(orders.every((r) => r.status === 201)).toBe(true);
    const cancels = await Promise.all(
      orders.slice(0, 10).map((o) => request(t.url).post(`/orders/${o.body.id}/cancel`).set('Authorization', bearer(ALICE))),
    );
    expect(cancels.filter((r) => r.status === 200)).toHaveLength(5);

    await until('every event sent and received', async () => (await unsent(t)) === 0 && queue.received.length >= 35);
    const rows = await outbox(t);
    expect(rows).toHaveLength(35);
    expect(queue.received).toHaveLength(35);
    const byId = new Map(queue.received.map((m) => [m.messageId, m]));
    expect(byId.size).toBe(35);
    for (const row of rows) {
      const message = byId.get(row.event_id)!;
      expect(message).toBeDefined();
      expect(message.routingKey).toBe(row.type);
      expect(message.body).toEqual(row.payload);
      expect(message.properties).toMatchObject({
        deliveryMode: 2,
        contentType: 'application/json',
        messageId: row.event_id,
        type: row.type,
      });
      expect(message.properties.timestamp).toBe(Math.floor(Date.parse(row.payload.occurredAt as string) / 1000));
      expect(row.attempts).toBe(1);
    }
    const metrics = (await request(t.url).get('/metrics')).text;
    expect(metrics).toMatch(/^order_events_published_total\{result="confirmed"\} 35$/m);
    expect(metrics).toMatch(/^order_events_outbox_pending 0$/m);
  });

  it('two relays on one database: each of 200 events published exactly once', async () => {
    const queue = await testQueue();
    const url = await database();
    const [a, b] = [await app({ AMQP_URL: broker.url }, url), await app({ AMQP_URL: broker.url }, url)];
    const answers = await Promise.all(Array.from({ length: 200 }, (_, i) => create(i % 2 ? a : b)));
    expect(answers.every((r) => r.status === 201)).toBe(true);
    await until('every event sent and received', async () => (await unsent(a)) === 0 && queue.received.length >= 200);
    const rows = await outbox(a);
    expect(rows).toHaveLength(200);
    expect(queue.received).toHaveLength(200);
    expect(new Set(queue.received.map((m) => m.messageId))).toEqual(new Set(rows.map((r) => r.event_id)));
    const confirmedBy = async (t: TestApp) =>
      Number(/^order_events_published_total\{result="confirmed"\} (\d+)$/m.exec((await request(t.url).get('/metrics')).text)![1]);
    const [byA, byB] = [await confirmedBy(a), await confirmedBy(b)];
    expect(byA + byB).toBe(200);
  });

  it('killed between the confirm and the mark: the event is published again (at least once), with the same messageId', async () => {
    const queue = await testQueue();
    const url = await database();
    const db = ignoreIdleErrors(new Pool({ connectionString: url, max: 2 }));
    cleanups.push(() => db.end());
    const row = async () => (await db.query<OutboxRow>(`SELECT event_id, type, payload, sent_at, attempts FROM order_events_outbox`)).rows;
    // The order is made with the relay off: its event waits in the outbox for the relay that will die.
    const off = await app({}, url);
    expect((await create(off)).status).toBe(201);
    await off.close();
    const [event] = await row();
    expect(event).toMatchObject({ sent_at: null, attempts: 0 });

    const child = spawn(process.execPath, [resolve(process.cwd(), 'dist/src/main.js')], {
      env: {
        PATH: process.env.PATH ?? '',
        PORT: '0',
        DATABASE_URL: url,
        API_KEYS: `${ALICE.clientId}:${ALICE.secret}`,
        PSP_WEBHOOK_SECRET: WEBHOOK_SECRET,
        PSP_SANDBOX: 'in-process',
        PSP_API_KEY: PSP_KEY,
        LOG_LEVEL: 'error',
        AMQP_URL: broker.url,
        // Its claim hides the row from other relays this long: the second relay sends it again after it.
        ORDER_EVENTS_LEASE_MS: '6000',
        ORDER_EVENTS_RELAY_FAULT: 'die-after-confirm',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
    cleanups.push(async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    });
    const [, signal] = await exited;
    expect(signal).toBe('SIGKILL');
    expect(output).toContain('die-after-confirm');

    // The broker confirmed it (the queue has it); the outbox never heard: unsent, claimed once, leased.
    await until('the first copy received', () => queue.received.length === 1);
    expect(queue.received[0].messageId).toBe(event.event_id);
    expect(await row()).toMatchObject([{ event_id: event.event_id, sent_at: null, attempts: 1 }]);

    // Another relay takes the row once the dead one's lease runs out, and publishes it again.
    await app({ AMQP_URL: broker.url }, url);
    await until(
      'the second copy received and the row marked',
      async () => queue.received.length === 2 && (await row())[0].sent_at !== null,
    );
    expect(queue.received.map((m) => m.messageId)).toEqual([event.event_id, event.event_id]);
    expect(queue.received[1].body).toEqual(queue.received[0].body);
    expect(await row()).toMatchObject([{ attempts: 2 }]);
  });

  it('RabbitMQ stopped for 5 s under load: no 5xx, nothing lost, the relay catches up by itself; /health says disconnected meanwhile', async () => {
    const queue = await testQueue();
    const t = await app({ AMQP_URL: broker.url });
    await until('relay connected', async () => (await request(t.url).get('/health')).body.orderEventsRelay === 'connected');
    const statuses: number[] = [];
    let loading = true;
    // Two clients creating orders back to back for the whole outage.
    const load = Promise.all(
      [ALICE, BOB].map(async (client) => {
        while (loading) statuses.push((await create(t, client)).status);
      }),
    );
    try {
      await until('some orders before the outage', () => statuses.length >= 20);
      await broker.stopBroker();
      const stoppedAt = Date.now();
      await until('/health says disconnected', async () => (await request(t.url).get('/health')).body.orderEventsRelay === 'disconnected');
      const during = statuses.length;
      await new Promise((r) => setTimeout(r, Math.max(0, 5_000 - (Date.now() - stoppedAt))));
      // The API kept answering while the broker was away; its events wait in the outbox.
      expect(statuses.length).toBeGreaterThan(during);
      expect(await unsent(t)).toBeGreaterThan(0);
      await broker.startBroker();
      await until('some orders after the outage', () => statuses.length >= during + 40, 60_000);
    } finally {
      loading = false;
      await load;
    }
    expect(statuses.filter((s) => s !== 201)).toEqual([]);
    await until('every event sent and received', async () => {
      if ((await unsent(t)) > 0) return false;
      return new Set(queue.received.map((m) => m.messageId)).size >= statuses.length;
    });
    const rows = await outbox(t);
    expect(rows).toHaveLength(statuses.length);
    // Nothing lost: every event reached the queue (a publish whose confirm the outage swallowed may arrive twice).
    expect(new Set(queue.received.map((m) => m.messageId))).toEqual(new Set(rows.map((r) => r.event_id)));
    expect((await request(t.url).get('/health')).body.orderEventsRelay).toBe('connected');
  }, 120_000);
});
