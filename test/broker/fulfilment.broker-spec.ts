/**
 * The fulfilment consumer as `npm run start:fulfilment` runs it (its own OS processes), against a real RabbitMQ and
 * PostgreSQL: one effect per event under SIGKILLs, duplicate publishes and two competing consumers; a poison message
 * dead-lettered after N attempts while the rest flow; events of one order applied by version, not arrival.
 */
import { randomUUID } from 'node:crypto';
import { connect as connectTcp, createServer, type Server, type Socket } from 'node:net';
import { resolve } from 'node:path';
import { connect } from 'amqplib';
import { type PoolClient, Pool } from 'pg';
import { freePort } from '../../src/common/free-port';
import { type RabbitMq, startRabbitMq } from '../support/rabbitmq';
import { FULFILMENT_AUTH, FULFILMENT_TOKEN, type ServiceProcess, startServiceProcess } from '../support/service-process';
import { until } from '../support/until';
import { createTestDatabase, ignoreIdleErrors } from '../support/test-app';
import { orderEvent, type OrderEventsPublisher, orderEventsPublisher } from './order-events-publisher';

const MAIN = resolve(process.cwd(), 'dist/apps/fulfilment/src/main.js');
const QUEUE = 'fulfilment.order-events';
const DEAD = 'fulfilment.order-events.dead-letters';
const MAX_ATTEMPTS = 3;

/**
 * A TCP relay in front of PostgreSQL: `cut()` closes it and every connection through it (the database is unreachable
 * to whoever uses it, ECONNREFUSED on connect), `restore()` listens again on the same port.
 */
async function databaseRelay(target: URL): Promise<{ url: string; cut(): Promise<void>; restore(): Promise<void> }> {
  const port = await freePort();
  const sockets = new Set<Socket>();
  let server: Server | undefined;
  const restore = () =>
    new Promise<void>((listening) => {
      server = createServer((client) => {
        const upstream = connectTcp(Number(target.port), target.hostname);
        for (const s of [client, upstream]) {
          sockets.add(s);
          s.on('error', () => undefined);
          s.on('close', () => (sockets.delete(s), client.destroy(), upstream.destroy()));
        }
        client.pipe(upstream).pipe(client);
      });
      server.listen(port, '127.0.0.1', listening);
    });
  const cut = async () => {
    const closed = new Promise((done) => server?.close(done));
    for (const s of sockets) s.destroy();
    await closed;
  };
  await restore();
  const url = new URL(target);
  url.hostname = '127.0.0.1';
  url.port = String(port);
  return { url: url.toString(), cut, restore };
}

/** `idempotent_messages_total` of one consumer process, by outcome. */
async function outcomes(consumer: ServiceProcess): Promise<Record<string, number>> {
  const text = await (await fetch(`${consumer.url}/metrics`, FULFILMENT_AUTH)).text();
  const counts: Record<string, number> = {};
  for (const [, outcome, value] of text.matchAll(/^idempotent_messages_total\{consumer="fulfilment",outcome="([a-z-]+)"\} (\d+)$/gm)) {
    counts[outcome] = Number(value);
  }
  return counts;
}

/** `idempotent_messages_held` of one consumer process: deliveries it holds unsettled while the database is unavailable. */
async function heldNow(consumer: ServiceProcess): Promise<number | undefined> {
  const text = await (await fetch(`${consumer.url}/metrics`, FULFILMENT_AUTH)).text();
  const found = /^idempotent_messages_held\{consumer="fulfilment"\} (\d+)$/m.exec(text);
  return found ? Number(found[1]) : undefined;
}

/** Lines of a consumer's output that contain every one of `parts`. */
const linesWith = (output: string, ...parts: string[]) => output.split('\n').filter((line) => parts.every((p) => line.includes(p))).length;

describe('fulfilment: one effect per order event, through RabbitMQ', () => {
  let broker: RabbitMq;
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let db: Pool;
  let publisher: OrderEventsPublisher;
  const consumers: ServiceProcess[] = [];

  const startConsumer = async (env: Record<string, string> = {}) => {
    const consumer = await startServiceProcess(
      {
        DATABASE_URL: database.url,
        AMQP_URL: broker.url,
        PORT: String(await freePort()),
        FULFILMENT_MAX_ATTEMPTS: String(MAX_ATTEMPTS),
        FULFILMENT_API_TOKEN: FULFILMENT_TOKEN,
        ...env,
      },
      { main: MAIN },
    );
    consumers.push(consumer);
    return consumer;
  };
  const stopConsumers = async () => {
    await Promise.all(
      consumers.splice(0).map(async (c) => {
        const forced = setTimeout(() => void c.kill('SIGKILL'), 10_000);
        await c.kill('SIGTERM');
        clearTimeout(forced);
      }),
    );
  };
  const count = async (sql: string, params: unknown[] = []) => (await db.query<{ n: number }>(sql, params)).rows[0].n;
  const shipments = (orderIds: string[]) =>
    count(`SELECT count(*)::int AS n FROM fulfilment.shipments WHERE order_id = ANY($1::uuid[])`, [orderIds]);

  beforeAll(async () => {
    [broker, database] = await Promise.all([startRabbitMq(), createTestDatabase({ empty: true })]);
    db = ignoreIdleErrors(new Pool({ connectionString: database.url, max: 2 }));
    publisher = await orderEventsPublisher(broker.url);
  }, 180_000);
  afterEach(stopConsumers, 60_000);
  afterAll(async () => {
    await stopConsumers();
    await publisher?.close().catch(() => undefined);
    await db?.end();
    await database?.drop();
    await broker?.stop();
  }, 120_000);

  it('500 order.paid while the consumer is SIGKILLed twice and restarted: exactly 500 shipments, none twice, the queue drained', async () => {
    const orderIds = Array.from({ length: 500 }, () => randomUUID());
    // The queue exists (with its dead-letter settings) once a consumer has started: then the events wait in it.
    await (await startConsumer()).kill('SIGTERM');
    consumers.length = 0;
    for (const orderId of orderIds) publisher.publish(orderEvent('order.paid', orderId, 2));
    await publisher.confirmed();

    const killedAt: number[] = [];
    for (let kill = 0; kill < 2; kill++) {
      const consumer = await startConsumer({ FULFILMENT_PREFETCH: '10' });
      const before = await shipments(orderIds);
      // Killed as soon as it has committed something: mid-stream, with deliveries in flight (some committed, not acked).
      await until('the consumer commits shipments', 30_000, async () => (await shipments(orderIds)) > before);
      await consumer.kill('SIGKILL');
      consumers.splice(consumers.indexOf(consumer), 1);
      killedAt.push(await shipments(orderIds));
    }
    expect(killedAt[1]).toBeLessThan(500);

    await startConsumer();
    await until('500 shipments', 60_000, async () => (await shipments(orderIds)) === 500);
    await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 });
    // One shipment per order (the primary key could not say otherwise); one mark per event; nothing dead-lettered.
    expect(
      await count(`SELECT count(*)::int AS n FROM fulfilment.shipments WHERE order_id = ANY($1::uuid[]) AND status = 'pending'`, [
        orderIds,
      ]),
    ).toBe(500);
    expect(await count(`SELECT count(*)::int AS n FROM fulfilment.processed_messages WHERE consumer = 'fulfilment'`)).toBe(500);
    expect(await broker.queueDepth(DEAD)).toEqual({ ready: 0, unacked: 0 });
  }, 240_000);

  it('each message published twice: one effect, the second found by its mark and acked', async () => {
    const consumer = await startConsumer();
    const events = Array.from({ length: 50 }, () => orderEvent('order.paid', randomUUID(), 2));
    for (const event of events) publisher.publish(event);
    for (const event of events) publisher.publish(event);
    await publisher.confirmed();

    await until('100 deliveries settled', 30_000, async () => {
      const seen = await outcomes(consumer);
      return (seen.applied ?? 0) + (seen.duplicate ?? 0) === 100;
    });
    expect(await outcomes(consumer)).toEqual({ applied: 50, duplicate: 50 });
    expect(await shipments(events.map((e) => e.orderId))).toBe(50);
    await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 });
  }, 120_000);

  it('two consumer instances on one queue, duplicates sent back to back: one effect per event across both', async () => {
    const [first, second] = await Promise.all([startConsumer(), startConsumer()]);
    const events = Array.from({ length: 300 }, () => orderEvent('order.paid', randomUUID(), 2));
    // Each event twice in a row: the two copies go to different consumers and are claimed concurrently.
    for (const event of events) {
      publisher.publish(event);
      publisher.publish(event);
    }
    await publisher.confirmed();

    const total = async () => {
      const [a, b] = await Promise.all([outcomes(first), outcomes(second)]);
      return { applied: (a.applied ?? 0) + (b.applied ?? 0), duplicate: (a.duplicate ?? 0) + (b.duplicate ?? 0), a, b };
    };
    await until('600 deliveries settled', 60_000, async () => {
      const { applied, duplicate } = await total();
      return applied + duplicate === 600;
    });
    const { applied, duplicate, a, b } = await total();
    expect({ applied, duplicate }).toEqual({ applied: 300, duplicate: 300 });
    // Both took part: the test is about competing consumers, not one doing everything.
    expect(a.applied ?? 0).toBeGreaterThan(0);
    expect(b.applied ?? 0).toBeGreaterThan(0);
    expect(await shipments(events.map((e) => e.orderId))).toBe(300);
    await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 });
  }, 120_000);

  it('a crash between the COMMIT and the ack (the connection cut while the effect commits): redelivered, found by its mark, acked, one effect', async () => {
    const consumer = await startConsumer();
    const event = orderEvent('order.paid', randomUUID(), 2);
    // The consumer's upsert will wait behind this uncommitted row of the same order: its mark is claimed, its delivery unacked.
    const blocker: PoolClient = await db.connect();
    try {
      await blocker.query('BEGIN');
      await blocker.query(
        `INSERT INTO fulfilment.shipments (order_id, client_id, status, total_minor, currency, order_version) VALUES ($1, 'x', 'pending', 0, 'EUR', 1)`,
        [event.orderId],
      );
      publisher.publish(event);
      await publisher.confirmed();
      const waiting = () => count(`SELECT count(*)::int AS n FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'`);
      await until('the consumer waits on the order', 30_000, async () => (await waiting()) === 1);

      // The cut: the broker takes the delivery back (and redelivers it on the consumer's new connection) …
      await broker.closeAllConnections();
      // Redelivered on the consumer's new connection, its claim now waits on the first transaction's mark.
      await until('the redelivery waits on the mark', 60_000, async () => (await waiting()) >= 2).catch((err: Error) => {
        throw new Error(`${err.message}\n${consumer.output()}`);
      });
    } finally {
      // … and only then may the first transaction go on and COMMIT; its ack goes to a channel that is gone.
      await blocker.query('ROLLBACK');
      blocker.release();
      // The cut closed the test's publisher too.
      publisher = await orderEventsPublisher(broker.url);
    }

    await until('the redelivery settled', 30_000, async () => (await outcomes(consumer)).duplicate === 1);
    expect(await outcomes(consumer)).toEqual({ duplicate: 1 });
    expect(consumer.output()).toContain('could not settle the message');
    expect(await count(`SELECT count(*)::int AS n FROM fulfilment.processed_messages WHERE message_id = $1`, [event.eventId])).toBe(1);
    const { rows } = await db.query(`SELECT status, order_version FROM fulfilment.shipments WHERE order_id = $1`, [event.orderId]);
    expect(rows).toEqual([{ status: 'pending', order_version: 2 }]);
    await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 });
  }, 120_000);

  it('the database unreachable for 3 s under load: deliveries are held, not retried away or dead-lettered; all applied after', async () => {
    const relay = await databaseRelay(new URL(database.url));
    try {
      const consumer = await startConsumer({ DATABASE_URL: relay.url });
      const events = Array.from({ length: 60 }, () => orderEvent('order.paid', randomUUID(), 2));
      events.slice(0, 20).forEach((event) => publisher.publish(event));
      await publisher.confirmed();
      await until('the first events applied', 30_000, async () => (await shipments(events.map((e) => e.orderId))) === 20);

      await relay.cut();
      events.slice(20).forEach((event) => publisher.publish(event));
      await publisher.confirmed();
      // Held deliveries tried more often, all told, than MAX_ATTEMPTS each: a consumer that counted these failures
      // against the messages would have dead-lettered them by now.
      const held = () => consumer.output().split('database unavailable: the message is held').length - 1;
      await until('the held deliveries retried', 30_000, () => Promise.resolve(held() >= 20 * (MAX_ATTEMPTS + 1)));
      await relay.restore();

      await until('all 60 applied', 60_000, async () => (await shipments(events.map((e) => e.orderId))) === 60);
      await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 });
      expect(await broker.queueDepth(DEAD)).toEqual({ ready: 0, unacked: 0 });
      const seen = await outcomes(consumer);
      expect(seen.applied).toBe(60);
      expect(seen['dead-lettered'] ?? 0).toBe(0);
      expect(seen.retried ?? 0).toBe(0);
    } finally {
      await stopConsumers();
      await relay.cut();
    }
  }, 120_000);

  it('the reaper deletes marks older than FULFILMENT_MARK_RETENTION_HOURS, keeps the rest', async () => {
    const [old, recent] = [randomUUID(), randomUUID()];
    await db.query(
      `INSERT INTO fulfilment.processed_messages (consumer, message_id, processed_at) VALUES
         ('fulfilment', $1, now() - interval '25 hours'), ('fulfilment', $2, now() - interval '23 hours')`,
      [old, recent],
    );
    await startConsumer({ FULFILMENT_MARK_RETENTION_HOURS: '24' });
    const left = () =>
      db.query<{ message_id: string }>(`SELECT message_id FROM fulfilment.processed_messages WHERE message_id = ANY($1)`, [[old, recent]]);
    await until('the old mark reaped', 30_000, async () => (await left()).rows.length === 1);
    expect((await left()).rows).toEqual([{ message_id: recent }]);
  }, 120_000);

  it(`a poison message is dead-lettered after ${MAX_ATTEMPTS} attempts (logged, counted) while the others flow`, async () => {
    const consumer = await startConsumer();
    const poisonId = randomUUID();
    const good = Array.from({ length: 40 }, () => orderEvent('order.paid', randomUUID(), 2));
    good.slice(0, 20).forEach((event) => publisher.publish(event));
    publisher.publishRaw('order.paid', poisonId, Buffer.from('{"eventId": not json'));
    good.slice(20).forEach((event) => publisher.publish(event));
    await publisher.confirmed();

    await until('the good events applied', 30_000, async () => (await shipments(good.map((e) => e.orderId))) === 40);
    await broker.untilQueueDepth(DEAD, { ready: 1, unacked: 0 });
    await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 });
    expect(await outcomes(consumer)).toEqual({ applied: 40, retried: MAX_ATTEMPTS - 1, 'dead-lettered': 1 });
    expect(consumer.output()).toContain(`message dead-lettered: failed ${MAX_ATTEMPTS} times`);
    // Rolled back each time: no mark, so a fixed-up replay from the dead-letter queue would be applied.
    expect(await count(`SELECT count(*)::int AS n FROM fulfilment.processed_messages WHERE message_id = $1`, [poisonId])).toBe(0);

    const connection = await connect(broker.url);
    try {
      const channel = await connection.createChannel();
      const dead = await channel.get(DEAD, { noAck: false });
      expect(dead && dead.properties.messageId).toBe(poisonId);
      // Dead-lettered by the consumer's nack (not by expiry or the queue's delivery-limit backstop), from our queue.
      const [death] = ((dead && dead.properties.headers?.['x-death']) ?? []) as { reason: string; queue: string }[];
      expect(death).toMatchObject({ reason: 'rejected', queue: QUEUE });
      if (dead) channel.ack(dead);
      await channel.close();
    } finally {
      await connection.close();
    }
  }, 120_000);

  it('JSON that is not the contract (a body type unlike the routed type, an amount as a string): dead-lettered, nothing written', async () => {
    const consumer = await startConsumer();
    const mismatched = { ...orderEvent('order.refunded', randomUUID(), 3) };
    const stringAmount = { ...orderEvent('order.paid', randomUUID(), 2), totalMinor: '4200' };
    publisher.publishRaw('order.paid', mismatched.eventId, Buffer.from(JSON.stringify(mismatched)));
    publisher.publishRaw('order.paid', stringAmount.eventId, Buffer.from(JSON.stringify(stringAmount)));
    await publisher.confirmed();

    await until('both dead-lettered', 30_000, async () => (await outcomes(consumer))['dead-lettered'] === 2);
    expect(consumer.output()).toContain('routed as order.paid but the body says order.refunded');
    expect(consumer.output()).toContain('totalMinor (integer minor units');
    expect(await shipments([mismatched.orderId, stringAmount.orderId])).toBe(0);
    expect(
      await count(`SELECT count(*)::int AS n FROM fulfilment.processed_messages WHERE message_id = ANY($1)`, [
        [mismatched.eventId, stringAmount.eventId],
      ]),
    ).toBe(0);
    await broker.untilQueueDepth(DEAD, { ready: 2, unacked: 0 });
    await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 });
  }, 120_000);

  it('order.refunded (v3) delivered before order.paid (v2): the shipment ends cancelled; in order too; HTTP shows it', async () => {
    const consumer = await startConsumer();
    const [reversed, inOrder] = [randomUUID(), randomUUID()];
    publisher.publish(orderEvent('order.refunded', reversed, 3));
    publisher.publish(orderEvent('order.paid', reversed, 2));
    publisher.publish(orderEvent('order.paid', inOrder, 2));
    publisher.publish(orderEvent('order.cancelled', inOrder, 3));
    await publisher.confirmed();

    await until('four deliveries settled', 30_000, async () => (await outcomes(consumer)).applied === 4);
    const rows = await db.query<{ order_id: string; status: string; order_version: number }>(
      `SELECT order_id, status, order_version FROM fulfilment.shipments WHERE order_id = ANY($1::uuid[]) ORDER BY order_id`,
      [[reversed, inOrder]],
    );
    expect(rows.rows.map((r) => [r.order_id, r.status, r.order_version])).toEqual(
      [
        [reversed, 'cancelled', 3],
        [inOrder, 'cancelled', 3],
      ].sort((x, y) => String(x[0]).localeCompare(String(y[0]))),
    );

    const found = await fetch(`${consumer.url}/shipments/${reversed}`, FULFILMENT_AUTH);
    expect(found.status).toBe(200);
    expect(await found.json()).toMatchObject({
      orderId: reversed,
      status: 'cancelled',
      orderVersion: 3,
      totalMinor: 4_200,
      currency: 'EUR',
    });
    const missing = await fetch(`${consumer.url}/shipments/${randomUUID()}`, FULFILMENT_AUTH);
    expect(missing.status).toBe(404);
    expect(missing.headers.get('content-type')).toContain('application/problem+json');
    const bad = await fetch(`${consumer.url}/shipments/not-a-uuid`, FULFILMENT_AUTH);
    expect(bad.status).toBe(400);
    expect(bad.headers.get('content-type')).toContain('application/problem+json');
    const health = await fetch(`${consumer.url}/health`);
    expect(health.status).toBe(200);
    expect(await health.json()).toEqual({ status: 'ok', database: 'up', broker: 'connected', consumer: 'consuming' });
  }, 120_000);

  it('order.voided (the order lost to a failover): cancels a pending shipment; before a late order.paid it stays cancelled; twice, one mark', async () => {
    const consumer = await startConsumer();
    const VOIDED_VERSION = 2_147_483_647;
    const [paidFirst, voidedFirst, newerShipment] = [randomUUID(), randomUUID(), randomUUID()];
    const settled = (n: number) =>
      until(`${n} deliveries settled`, 30_000, async () => {
        const seen = await outcomes(consumer);
        return (seen.applied ?? 0) + (seen.duplicate ?? 0) === n;
      }).catch((err: Error) => {
        throw new Error(`${err.message}\n${consumer.output().slice(-3000)}`);
      });
    publisher.publish(orderEvent('order.paid', paidFirst, 2));
    publisher.publish(orderEvent('order.paid', newerShipment, 5));
    await publisher.confirmed();
    await settled(2);

    // The same voided message twice (a republish); another before its order's paid; one below the shipment's version.
    const voided = orderEvent('order.voided', paidFirst, VOIDED_VERSION);
    publisher.publish(voided);
    publisher.publish(voided);
    publisher.publish(orderEvent('order.voided', voidedFirst, VOIDED_VERSION));
    publisher.publish(orderEvent('order.voided', newerShipment, 3));
    await publisher.confirmed();
    await settled(6);
    // The late (redelivered) order.paid of the voided order: no pending shipment comes of it.
    publisher.publish(orderEvent('order.paid', voidedFirst, 2));
    await publisher.confirmed();
    await settled(7);

    expect(await outcomes(consumer)).toEqual({ applied: 6, duplicate: 1 });
    const { rows } = await db.query<{ order_id: string; status: string; order_version: number }>(
      `SELECT order_id, status, order_version FROM fulfilment.shipments WHERE order_id = ANY($1::uuid[])`,
      [[paidFirst, voidedFirst, newerShipment]],
    );
    expect(Object.fromEntries(rows.map((r) => [r.order_id, [r.status, r.order_version]]))).toEqual({
      [paidFirst]: ['cancelled', VOIDED_VERSION],
      [voidedFirst]: ['cancelled', VOIDED_VERSION],
      [newerShipment]: ['cancelled', 5],
    });
    expect(await count(`SELECT count(*)::int AS n FROM fulfilment.processed_messages WHERE message_id = $1`, [voided.eventId])).toBe(1);
    await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 });
  }, 120_000);

  /** Empties the dead-letter queue, which earlier tests leave messages in. */
  const purgeDeadLetters = async () => {
    const connection = await connect(broker.url);
    try {
      const channel = await connection.createChannel();
      await channel.purgeQueue(DEAD);
      await channel.close();
    } finally {
      await connection.close();
    }
    await broker.untilQueueDepth(DEAD, { ready: 0, unacked: 0 });
  };

  it('a batch (group commit) holding a poison message: the others commit once each, in shared transactions; the poison alone is retried, then dead-lettered', async () => {
    await purgeDeadLetters();
    // A long gathering window: the first batch holds the poison and nine good messages.
    const consumer = await startConsumer({ FULFILMENT_BATCH_SIZE: '10', FULFILMENT_BATCH_WAIT_MS: '200', FULFILMENT_PREFETCH: '20' });
    const poisonId = randomUUID();
    const good = Array.from({ length: 29 }, () => orderEvent('order.paid', randomUUID(), 2));
    publisher.publishRaw('order.paid', poisonId, Buffer.from('{"eventId": not json'));
    good.forEach((event) => publisher.publish(event));
    await publisher.confirmed();

    await until('the good events applied', 30_000, async () => (await shipments(good.map((e) => e.orderId))) === 29);
    await broker.untilQueueDepth(DEAD, { ready: 1, unacked: 0 });
    await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 });
    expect(await outcomes(consumer)).toEqual({ applied: 29, retried: MAX_ATTEMPTS - 1, 'dead-lettered': 1 });
    // Several messages per transaction (a shipment's created_at is its transaction's start), each marked once.
    const { rows } = await db.query<{ transactions: number; shipments: number }>(
      `SELECT count(DISTINCT created_at)::int AS transactions, count(*)::int AS shipments FROM fulfilment.shipments WHERE order_id = ANY($1::uuid[])`,
      [good.map((e) => e.orderId)],
    );
    expect(rows[0].shipments).toBe(29);
    expect(rows[0].transactions).toBeLessThanOrEqual(10);
    expect(
      await count(`SELECT count(*)::int AS n FROM fulfilment.processed_messages WHERE message_id = ANY($1)`, [good.map((e) => e.eventId)]),
    ).toBe(29);
    // Its savepoint rolled back with its mark: a fixed-up replay from the dead-letter queue would be applied.
    expect(await count(`SELECT count(*)::int AS n FROM fulfilment.processed_messages WHERE message_id = $1`, [poisonId])).toBe(0);
    const connection = await connect(broker.url);
    try {
      const channel = await connection.createChannel();
      const dead = await channel.get(DEAD, { noAck: false });
      expect(dead && dead.properties.messageId).toBe(poisonId);
      if (dead) channel.ack(dead);
      await channel.close();
    } finally {
      await connection.close();
    }
  }, 120_000);

  it("SIGKILL between a batch's COMMIT and its acks: the whole batch redelivered, each found by its mark, no second effect", async () => {
    await purgeDeadLetters();
    const events = Array.from({ length: 40 }, () => orderEvent('order.paid', randomUUID(), 2));
    const orderIds = events.map((e) => e.orderId);
    // The first consumer dies right after its first batch commits: its deliveries, committed, are never acked.
    const dying = await startConsumer({
      FULFILMENT_FAULT: 'die-after-batch-commit',
      FULFILMENT_BATCH_SIZE: '10',
      FULFILMENT_BATCH_WAIT_MS: '200',
    });
    events.forEach((event) => publisher.publish(event));
    await publisher.confirmed();
    expect(await dying.exited).toBeNull();
    expect(dying.child.signalCode).toBe('SIGKILL');
    consumers.splice(consumers.indexOf(dying), 1);
    expect(dying.output()).toMatch(/die-after-batch-commit: dying before acking (\d+) committed messages/);
    const committed = Number(/dying before acking (\d+)/.exec(dying.output())![1]);
    expect(committed).toBeGreaterThan(1);
    expect(await shipments(orderIds)).toBe(committed);

    const survivor = await startConsumer();
    await until('all 40 applied', 30_000, async () => (await shipments(orderIds)) === 40);
    await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 });
    await until('40 deliveries settled', 30_000, async () => {
      const seen = await outcomes(survivor);
      return (seen.applied ?? 0) + (seen.duplicate ?? 0) === 40;
    });
    // The dead batch's messages came back and were found by their marks; the rest applied once.
    expect(await outcomes(survivor)).toEqual({ applied: 40 - committed, duplicate: committed });
    expect(
      await count(`SELECT count(*)::int AS n FROM fulfilment.processed_messages WHERE message_id = ANY($1)`, [
        events.map((e) => e.eventId),
      ]),
    ).toBe(40);
    expect(await broker.queueDepth(DEAD)).toEqual({ ready: 0, unacked: 0 });
  }, 120_000);

  describe('failures of the database, not of the message', () => {
    // The schema and the queues exist once a consumer has started (these tests may run alone, with -t).
    beforeAll(async () => {
      await (await startConsumer()).kill('SIGTERM');
      consumers.length = 0;
    }, 60_000);
    beforeEach(purgeDeadLetters, 30_000);

    it('the database refuses connections (53300, the role at its CONNECTION LIMIT): good messages are held, not dead-lettered; all applied after', async () => {
      // The consumer logs in as a role of its own, whose connection limit the test can take away.
      const role = `fulfilment_${randomUUID().replace(/-/g, '').slice(0, 12)}`;
      await db.query(`CREATE ROLE ${role} LOGIN PASSWORD 'limited'`);
      await db.query(`GRANT USAGE ON SCHEMA fulfilment TO ${role}`);
      await db.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA fulfilment, public TO ${role}`);
      const url = new URL(database.url);
      url.username = role;
      url.password = 'limited';
      try {
        const consumer = await startConsumer({ DATABASE_URL: url.toString() });
        const events = Array.from({ length: 40 }, () => orderEvent('order.paid', randomUUID(), 2));
        const orderIds = events.map((e) => e.orderId);
        events.slice(0, 10).forEach((event) => publisher.publish(event));
        await publisher.confirmed();
        await until('the first events applied', 30_000, async () => (await shipments(orderIds)) === 10);

        // No new connection for the role, and its open ones cut: every connect is refused with 53300.
        await db.query(`ALTER ROLE ${role} CONNECTION LIMIT 0`);
        await db.query(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, [role]);
        events.slice(10).forEach((event) => publisher.publish(event));
        await publisher.confirmed();
        // Held and tried again more often, all told, than MAX_ATTEMPTS each: counted against the messages, they would be
        // dead-lettered by now.
        await until('the held deliveries refused more than MAX_ATTEMPTS times each', 30_000, () =>
          Promise.resolve(linesWith(consumer.output(), 'the message is held', 'too many connections') >= 20 * (MAX_ATTEMPTS + 1)),
        ).catch((err: Error) => {
          throw new Error(`${err.message}\n${consumer.output().slice(-3000)}`);
        });
        await db.query(`ALTER ROLE ${role} CONNECTION LIMIT -1`);

        await until('all 40 applied', 60_000, async () => (await shipments(orderIds)) === 40);
        await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 });
        expect(await broker.queueDepth(DEAD)).toEqual({ ready: 0, unacked: 0 });
        expect(await outcomes(consumer)).toEqual({ applied: 40 });
        expect(await heldNow(consumer)).toBe(0);
      } finally {
        await stopConsumers();
        await db.query(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, [role]);
        await db.query(`DROP OWNED BY ${role}`);
        await db.query(`DROP ROLE ${role}`);
      }
    }, 120_000);

    it(`a message whose effect always meets a lock timeout, or a deadlock, is dead-lettered after ${MAX_ATTEMPTS} attempts while the others flow`, async () => {
      const [locked, deadlocked] = [orderEvent('order.paid', randomUUID(), 2), orderEvent('order.paid', randomUUID(), 2)];
      // The effect of `locked` waits for an advisory lock the test holds, under a 50 ms lock_timeout: a real 55P03 every
      // time. That of `deadlocked` is refused with deadlock_detected every time, as a deadlock its own writes cause would be.
      await db.query(`
      CREATE FUNCTION fulfilment.test_contended() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF NEW.order_id = '${locked.orderId}' THEN
          PERFORM set_config('lock_timeout', '50ms', true);
          PERFORM pg_advisory_xact_lock(424242);
        ELSIF NEW.order_id = '${deadlocked.orderId}' THEN
          RAISE EXCEPTION 'deadlock detected (every time, for this order)' USING ERRCODE = 'deadlock_detected';
        END IF;
        RETURN NEW;
      END $$`);
      await db.query(
        `CREATE TRIGGER test_contended BEFORE INSERT OR UPDATE ON fulfilment.shipments FOR EACH ROW EXECUTE FUNCTION fulfilment.test_contended()`,
      );
      const holder: PoolClient = await db.connect();
      try {
        await holder.query(`SELECT pg_advisory_lock(424242)`);
        const consumer = await startConsumer();
        const good = Array.from({ length: 30 }, () => orderEvent('order.paid', randomUUID(), 2));
        good.slice(0, 15).forEach((event) => publisher.publish(event));
        publisher.publish(locked);
        publisher.publish(deadlocked);
        good.slice(15).forEach((event) => publisher.publish(event));
        await publisher.confirmed();

        await until('the good events applied', 30_000, async () => (await shipments(good.map((e) => e.orderId))) === 30);
        await broker.untilQueueDepth(DEAD, { ready: 2, unacked: 0 }, 60_000).catch((err: Error) => {
          throw new Error(`${err.message}\n${consumer.output().slice(-3000)}`);
        });
        await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 });
        expect(await outcomes(consumer)).toEqual({ applied: 30, retried: 2 * (MAX_ATTEMPTS - 1), 'dead-lettered': 2 });
        expect(linesWith(consumer.output(), 'message dead-lettered', locked.eventId, 'lock timeout')).toBe(1);
        expect(linesWith(consumer.output(), 'message dead-lettered', deadlocked.eventId, 'deadlock detected')).toBe(1);
        expect(await shipments([locked.orderId, deadlocked.orderId])).toBe(0);
        expect(await heldNow(consumer)).toBe(0);
      } finally {
        await stopConsumers();
        await holder.query(`SELECT pg_advisory_unlock(424242)`).catch(() => undefined);
        holder.release();
        await db.query(`DROP TRIGGER test_contended ON fulfilment.shipments`);
        await db.query(`DROP FUNCTION fulfilment.test_contended()`);
      }
    }, 120_000);

    it('deliveries held through a database outage are dropped when their channel closes: broker flaps do not pile them up, each message applied once', async () => {
      const relay = await databaseRelay(new URL(database.url));
      try {
        const consumer = await startConsumer({ DATABASE_URL: relay.url, FULFILMENT_PREFETCH: '10' });
        const events = Array.from({ length: 30 }, () => orderEvent('order.paid', randomUUID(), 2));
        const orderIds = events.map((e) => e.orderId);
        events.slice(0, 5).forEach((event) => publisher.publish(event));
        await publisher.confirmed();
        await until('the first events applied', 30_000, async () => (await shipments(orderIds)) === 5);

        await relay.cut();
        events.slice(5).forEach((event) => publisher.publish(event));
        await publisher.confirmed();
        await until('a prefetch of deliveries held', 30_000, async () => (await heldNow(consumer)) === 10);
        for (let flap = 1; flap <= 3; flap++) {
          // The broker takes the held deliveries back and delivers them again on the consumer's new connection.
          await broker.closeAllConnections();
          await until(
            `the redeliveries held after flap ${flap}`,
            60_000,
            async () =>
              linesWith(consumer.output(), 'the channel closed while the message was held') >= 10 * flap &&
              (await heldNow(consumer)) === 10,
          ).catch(async (err: Error) => {
            throw new Error(`${err.message} (held ${await heldNow(consumer)})\n${consumer.output().slice(-3000)}`);
          });
        }
        // The flaps closed the test's publisher too.
        publisher = await orderEventsPublisher(broker.url);
        await relay.restore();

        await until('all 30 applied', 60_000, async () => (await shipments(orderIds)) === 30);
        await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 });
        await until('30 deliveries settled', 30_000, async () => (await outcomes(consumer)).applied === 30);
        // Only the live deliveries committed: none held for a dead channel committed first and left the live one a duplicate.
        const { dropped, ...settled } = await outcomes(consumer);
        expect(settled).toEqual({ applied: 30 });
        expect(dropped).toBeGreaterThanOrEqual(30);
        expect(consumer.output()).not.toContain('could not settle the message');
        expect(await heldNow(consumer)).toBe(0);
        expect(
          await count(`SELECT count(*)::int AS n FROM fulfilment.processed_messages WHERE message_id = ANY($1)`, [
            events.map((e) => e.eventId),
          ]),
        ).toBe(30);
        expect(await broker.queueDepth(DEAD)).toEqual({ ready: 0, unacked: 0 });
      } finally {
        await stopConsumers();
        await relay.cut();
      }
    }, 180_000);
  });
});
