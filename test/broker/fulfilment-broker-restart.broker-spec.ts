/**
 * The fulfilment consumer (`npm run start:fulfilment`, its own process) while its broker goes away or drops its
 * consumer: RabbitMQ stopped cleanly mid-stream, then killed with SIGKILL mid-stream (by the node's pid: no clean
 * shutdown to drain anything first), each time away for 5 s and started again on the same ports and data; and the
 * consumer cancelled by the broker while its connection stays up. Each time the consumer takes up its queue again by
 * itself, every event ends as exactly one effect, and /health says whether this process is consuming — never 200
 * while it is not.
 *
 * One node for all three, in order: the clean stop also puts the queue's registration on disk, without which a
 * RabbitMQ 3.10 node killed with SIGKILL can come back with the quorum queue emptied and leaderless (a broker bug,
 * docs/patterns/message-consumer.md#when-the-broker-crashes): this suite proves the consumer, not that bug.
 */
import { randomUUID } from 'node:crypto';
import { resolve } from 'node:path';
import { Pool } from 'pg';
import { freePort } from '../../src/common/free-port';
import { alive, type RabbitMq, startRabbitMq } from '../support/rabbitmq';
import { FULFILMENT_AUTH, FULFILMENT_TOKEN, type ServiceProcess, startServiceProcess } from '../support/service-process';
import { until } from '../support/until';
import { createTestDatabase, ignoreIdleErrors } from '../support/test-app';
import { orderEvent, type OrderEventsPublisher, orderEventsPublisher, type TestOrderEvent } from './order-events-publisher';

const MAIN = resolve(process.cwd(), 'dist/apps/fulfilment/src/main.js');
const QUEUE = 'fulfilment.order-events';
const DEAD = 'fulfilment.order-events.dead-letters';
const BEFORE = 4_000;
const AFTER = 200;
const OUTAGE_MS = 5_000;

/** Closes a publisher, giving up after `ms`: a channel the broker nacked or dropped must not hang the clean-up. */
const closeWithin = (publisher: OrderEventsPublisher, ms: number) =>
  Promise.race([publisher.close().catch(() => undefined), new Promise((r) => setTimeout(r, ms))]);

describe('fulfilment: the broker stopped, killed, or dropping the consumer under an attached consumer', () => {
  let broker: RabbitMq;
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let db: Pool;
  let consumer: ServiceProcess;
  const publishers = new Set<OrderEventsPublisher>();

  beforeAll(async () => {
    [broker, database] = await Promise.all([startRabbitMq(), createTestDatabase({ empty: true })]);
    db = ignoreIdleErrors(new Pool({ connectionString: database.url, max: 2 }));
    consumer = await startServiceProcess(
      {
        DATABASE_URL: database.url,
        AMQP_URL: broker.url,
        PORT: String(await freePort()),
        FULFILMENT_PREFETCH: '20',
        FULFILMENT_API_TOKEN: FULFILMENT_TOKEN,
      },
      { main: MAIN },
    );
  }, 180_000);
  afterAll(async () => {
    if (consumer) {
      const forced = setTimeout(() => void consumer.kill('SIGKILL'), 10_000);
      await consumer.kill('SIGTERM');
      clearTimeout(forced);
    }
    await Promise.all([...publishers].map((p) => closeWithin(p, 5_000)));
    await db?.end();
    await database?.drop();
    await broker?.stop();
  }, 120_000);

  const count = async (sql: string, params: unknown[] = []) => (await db.query<{ n: number }>(sql, params)).rows[0].n;
  const shipments = (events: TestOrderEvent[]) =>
    count(`SELECT count(*)::int AS n FROM fulfilment.shipments WHERE order_id = ANY($1::uuid[])`, [events.map((e) => e.orderId)]);
  const health = async () => {
    const response = await fetch(`${consumer.url}/health`);
    return {
      status: response.status,
      type: response.headers.get('content-type'),
      body: (await response.json()) as Record<string, unknown>,
    };
  };
  const consumingAgain = async () => {
    await until('/health says consuming again', 60_000, async () => (await health()).status === 200).catch(async (err: Error) => {
      // The queue's Raft state says whether the broker has a queue to consume from at all (a leader) or not.
      throw new Error(`${err.message}\n${await broker.quorumStatus(QUEUE)}`);
    });
    expect((await health()).body).toEqual({ status: 'ok', database: 'up', broker: 'connected', consumer: 'consuming' });
  };
  const outcomes = async (): Promise<Record<string, number>> => {
    const text = await (await fetch(`${consumer.url}/metrics`, FULFILMENT_AUTH)).text();
    const counts: Record<string, number> = {};
    for (const [, outcome, value] of text.matchAll(/^idempotent_messages_total\{consumer="fulfilment",outcome="([a-z-]+)"\} (\d+)$/gm)) {
      counts[outcome] = Number(value);
    }
    return counts;
  };

  /**
   * Publishes with confirms. Right after a broker restart a quorum queue may still be recovering its log and the broker
   * nacks a publish: a publisher sends again what was not confirmed (the consumer's marks make copies harmless), as the
   * service's relay does.
   */
  const publishAll = async (events: TestOrderEvent[]) => {
    const deadline = Date.now() + 60_000;
    for (;;) {
      const publisher = await orderEventsPublisher(broker.url);
      publishers.add(publisher);
      for (const event of events) publisher.publish(event);
      const confirmed = await publisher.confirmed().then(
        () => true,
        (err: unknown) => {
          if (Date.now() > deadline) throw err;
          return false;
        },
      );
      await closeWithin(publisher, 5_000);
      publishers.delete(publisher);
      if (confirmed) return;
      await new Promise((r) => setTimeout(r, 500));
    }
  };

  /** Every event one shipment, one mark; the queue and the dead letters empty; nothing retried or dead-lettered. */
  const exactlyOnce = async (events: TestOrderEvent[], seenBefore: Record<string, number>) => {
    await until(`${events.length} shipments`, 120_000, async () => (await shipments(events)) === events.length);
    await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 }, 60_000);
    expect(await broker.queueDepth(DEAD)).toEqual({ ready: 0, unacked: 0 });
    expect(
      await count(`SELECT count(*)::int AS n FROM fulfilment.shipments WHERE order_id = ANY($1::uuid[]) AND status = 'pending'`, [
        events.map((e) => e.orderId),
      ]),
    ).toBe(events.length);
    expect(
      await count(`SELECT count(*)::int AS n FROM fulfilment.processed_messages WHERE message_id = ANY($1)`, [
        events.map((e) => e.eventId),
      ]),
    ).toBe(events.length);
    // A delivery committed whose ack found its channel gone is counted once its redelivery is acked, as a duplicate.
    const seen = await outcomes();
    const applied = seen.applied - (seenBefore.applied ?? 0);
    expect(applied).toBeLessThanOrEqual(events.length);
    expect(applied + (seen.duplicate ?? 0) - (seenBefore.duplicate ?? 0)).toBeGreaterThanOrEqual(events.length);
    expect(seen['dead-lettered'] ?? 0).toBe(0);
    expect(seen.retried ?? 0).toBe(0);
  };

  /** 4,000 queued, the broker taken away once some are applied, away 5 s, started again; 200 more published after. */
  const outageMidStream = async (takeAway: () => Promise<void>) => {
    await consumingAgain();
    const seenBefore = await outcomes();
    const before = Array.from({ length: BEFORE }, () => orderEvent('order.paid', randomUUID(), 2));
    await publishAll(before);
    // Taken away while the consumer is busy: some events applied, deliveries in flight, the rest waiting in the queue.
    await until('the consumer applies some events', 30_000, async () => (await shipments(before)) >= 100);
    await takeAway();
    const awayAt = Date.now();
    expect(await shipments(before)).toBeLessThan(BEFORE);

    await until('/health says the broker is away', 10_000, async () => (await health()).status === 503);
    const away = await health();
    expect(away.type).toContain('application/problem+json');
    expect(away.body).toMatchObject({
      status: 503,
      database: 'up',
      broker: 'disconnected',
      consumer: 'not consuming',
      detail: 'database up, broker disconnected, not consuming',
    });
    await new Promise((r) => setTimeout(r, Math.max(0, OUTAGE_MS - (Date.now() - awayAt))));
    // Still away (no broker to reconnect to), still the same process: nothing restarted it.
    expect((await health()).status).toBe(503);
    expect(consumer.child.exitCode).toBeNull();

    await broker.startBroker();
    await consumingAgain();
    const after = Array.from({ length: AFTER }, () => orderEvent('order.paid', randomUUID(), 2));
    await publishAll(after);
    await exactlyOnce([...before, ...after], seenBefore);
  };

  it(`stopped for ${OUTAGE_MS / 1000} s mid-stream: the consumer takes up its queue again by itself, every event one effect, the queue drained, /health follows`, async () => {
    await outageMidStream(() => broker.stopBroker());
  }, 300_000);

  it(`killed with SIGKILL for ${OUTAGE_MS / 1000} s mid-stream: the same, with no clean shutdown to drain anything`, async () => {
    await outageMidStream(async () => {
      const nodePid = broker.pid()!;
      await broker.killBroker();
      expect(alive(nodePid)).toBe(false);
    });
  }, 300_000);

  it('the broker cancels the consumer while the connection stays up (its queue deleted): the consumer declares it again and consumes; /health says not consuming meanwhile', async () => {
    await consumingAgain();
    const seenBefore = await outcomes();
    const output = consumer.output().length;
    await broker.deleteQueue(QUEUE);
    // Nest's own transport stayed connected here and consumed nothing, for good, while its /health said connected.
    // Here /health says so for the second before the consumer connects again.
    await until('/health: connected, not consuming', 10_000, async () => {
      const { status, body } = await health();
      return status === 503 && body.broker === 'connected' && body.consumer === 'not consuming';
    });
    await until('the consumer logs why', 10_000, () =>
      Promise.resolve(consumer.output().slice(output).includes('consumer of fulfilment.order-events lost')),
    );
    expect(consumer.output().slice(output)).toContain('lost (the broker cancelled it)');
    await consumingAgain();
    await broker.untilQueueDepth(QUEUE, { ready: 0, unacked: 0 }, 10_000);
    const events = Array.from({ length: AFTER }, () => orderEvent('order.paid', randomUUID(), 2));
    await publishAll(events);
    await exactlyOnce(events, seenBefore);
  }, 180_000);
});
