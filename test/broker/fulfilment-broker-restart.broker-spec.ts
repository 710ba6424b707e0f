/**
 * The fulfilment consumer (`npm run start:fulfilment`, its own process) while its broker goes away: RabbitMQ's node
 * killed mid-stream (the harness's own node, SIGKILL by its pid: no clean shutdown to drain anything first; its data
 * kept), away for 5 s, started again on the same ports and data. The consumer reconnects by itself (Nest's RMQ transport, through
 * amqp-connection-manager), every
 * event ends as exactly one effect, and its /health says where the broker is.
 */
import { randomUUID } from 'node:crypto';
import { resolve } from 'node:path';
import { Pool } from 'pg';
import { freePort } from '../../src/common/free-port';
import { alive, type RabbitMq, startRabbitMq } from '../support/rabbitmq';
import { type ServiceProcess, startServiceProcess } from '../support/service-process';
import { createTestDatabase, ignoreIdleErrors } from '../support/test-app';
import { orderEvent, type OrderEventsPublisher, orderEventsPublisher } from './order-events-publisher';

const MAIN = resolve(process.cwd(), 'dist/apps/fulfilment/src/main.js');
const QUEUE = 'fulfilment.order-events';
const DEAD = 'fulfilment.order-events.dead';
const BEFORE = 4_000;
const AFTER = 200;
const OUTAGE_MS = 5_000;

const until = async (what: string, deadlineMs: number, done: () => Promise<boolean>) => {
  const deadline = Date.now() + deadlineMs;
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`not within ${deadlineMs} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
};

/** Closes a publisher, giving up after `ms`: a channel the broker nacked or dropped must not hang the clean-up. */
const closeWithin = (publisher: OrderEventsPublisher, ms: number) =>
  Promise.race([publisher.close().catch(() => undefined), new Promise((r) => setTimeout(r, ms))]);

describe('fulfilment: RabbitMQ killed and started again under an attached consumer', () => {
  let broker: RabbitMq;
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let db: Pool;
  let publisher: OrderEventsPublisher | undefined;
  let consumer: ServiceProcess | undefined;

  beforeAll(async () => {
    [broker, database] = await Promise.all([startRabbitMq(), createTestDatabase({ empty: true })]);
    db = ignoreIdleErrors(new Pool({ connectionString: database.url, max: 2 }));
  }, 180_000);
  afterAll(async () => {
    if (consumer) {
      const forced = setTimeout(() => void consumer?.kill('SIGKILL'), 10_000);
      await consumer.kill('SIGTERM');
      clearTimeout(forced);
    }
    if (publisher) await closeWithin(publisher, 5_000);
    await db?.end();
    await database?.drop();
    await broker?.stop();
  }, 120_000);

  const count = async (sql: string, params: unknown[] = []) => (await db.query<{ n: number }>(sql, params)).rows[0].n;
  const shipments = (orderIds: string[]) =>
    count(`SELECT count(*)::int AS n FROM fulfilment.shipments WHERE order_id = ANY($1::uuid[])`, [orderIds]);
  const health = async () => {
    const response = await fetch(`${consumer!.url}/health`);
    return {
      status: response.status,
      type: response.headers.get('content-type'),
      body: (await response.json()) as Record<string, unknown>,
    };
  };
  const outcomes = async (): Promise<Record<string, number>> => {
    const text = await (await fetch(`${consumer!.url}/metrics`)).text();
    const counts: Record<string, number> = {};
    for (const [, outcome, value] of text.matchAll(/^idempotent_messages_total\{consumer="fulfilment",outcome="([a-z-]+)"\} (\d+)$/gm)) {
      counts[outcome] = Number(value);
    }
    return counts;
  };

  it(`killed for ${OUTAGE_MS / 1000} s mid-stream: the consumer reconnects by itself, every event one effect, the queue drained, /health follows`, async () => {
    consumer = await startServiceProcess(
      { DATABASE_URL: database.url, AMQP_URL: broker.url, PORT: String(await freePort()), FULFILMENT_PREFETCH: '20' },
      { main: MAIN },
    );
    await until('/health says connected', 30_000, async () => (await health()).status === 200);

    const before = Array.from({ length: BEFORE }, () => orderEvent('order.paid', randomUUID(), 2));
    publisher = await orderEventsPublisher(broker.url);
    for (const event of before) publisher.publish(event);
    await publisher.confirmed();
    await publisher.close();
    publisher = undefined;

    // Stopped while the consumer is busy: some events applied, deliveries in flight, the rest waiting in the queue.
    const ids = before.map((e) => e.orderId);
    await until('the consumer applies some events', 30_000, async () => (await shipments(ids)) >= 100);
    const nodePid = broker.pid()!;
    await broker.killBroker();
    expect(alive(nodePid)).toBe(false);
    const stoppedAt = Date.now();
    const appliedAtStop = await shipments(ids);
    expect(appliedAtStop).toBeLessThan(BEFORE);

    await until('/health says the broker is away', 10_000, async () => (await health()).status === 503);
    const away = await health();
    expect(away.type).toContain('application/problem+json');
    expect(away.body).toMatchObject({ status: 503, database: 'up', broker: 'disconnected', detail: 'database up, broker disconnected' });
    await new Promise((r) => setTimeout(r, Math.max(0, OUTAGE_MS - (Date.now() - stoppedAt))));
    // Still away (no broker to reconnect to), still the same process: nothing restarted it.
    expect((await health()).status).toBe(503);
    expect(consumer.child.exitCode).toBeNull();

    await broker.startBroker();
    await until('/health says connected again', 60_000, async () => (await health()).status === 200);
    expect((await health()).body).toEqual({ status: 'ok', database: 'up', broker: 'connected' });

    // Events published after the restart reach the same consumer too. Right after a restart the queue may still be
    // recovering and the broker nacks a publish: a publisher sends again what was not confirmed (the consumer's marks
    // make the copies harmless), as the service's relay does.
    const after = Array.from({ length: AFTER }, () => orderEvent('order.paid', randomUUID(), 2));
    const publishDeadline = Date.now() + 60_000;
    for (;;) {
      publisher = await orderEventsPublisher(broker.url);
      for (const event of after) publisher.publish(event);
      const confirmed = await publisher.confirmed().then(
        () => true,
        (err: unknown) => {
          if (Date.now() > publishDeadline) throw err;
          return false;
        },
      );
      if (confirmed) break;
      await closeWithin(publisher, 5_000);
      publisher = undefined;
      await new Promise((r) => setTimeout(r, 500));
    }

    const all = [...before, ...after];
    await until(`${all.length} shipments`, 120_000, async () => (await shipments(all.map((e) => e.orderId))) === all.length);
    await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 }, 60_000);
    expect(await broker.queueDepth(DEAD)).toEqual({ ready: 0, unacked: 0 });
    // Exactly one effect and one mark per event; a delivery committed before the stop but not acked came back as a duplicate.
    expect(
      await count(`SELECT count(*)::int AS n FROM fulfilment.shipments WHERE order_id = ANY($1::uuid[]) AND status = 'pending'`, [
        all.map((e) => e.orderId),
      ]),
    ).toBe(all.length);
    expect(
      await count(`SELECT count(*)::int AS n FROM fulfilment.processed_messages WHERE message_id = ANY($1)`, [all.map((e) => e.eventId)]),
    ).toBe(all.length);
    // A delivery committed whose ack found its channel gone is counted once its redelivery is acked, as a duplicate.
    const seen = await outcomes();
    expect(seen.applied).toBeLessThanOrEqual(all.length);
    expect(seen.applied + (seen.duplicate ?? 0)).toBeGreaterThanOrEqual(all.length);
    expect(seen['dead-lettered'] ?? 0).toBe(0);
    expect(seen.retried ?? 0).toBe(0);
  }, 300_000);
});
