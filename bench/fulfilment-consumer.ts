/**
 * npm run bench:consumer — the fulfilment consumer's throughput and lag. By default it starts what it needs: a real
 * RabbitMQ (Debian's rabbitmq-server, through the tests' harness), an embedded PostgreSQL (its Unix socket), and the
 * consumer as `npm run start:fulfilment` runs it (its own process; BENCH_CONSUMER_ENV='FULFILMENT_BATCH_SIZE=1 …'
 * adds to its environment). With AMQP_URL and DATABASE_URL set, it measures a consumer already running on those.
 *
 * 1. Burst: BENCH_EVENTS (5000) `order.paid` published with confirms as fast as the broker takes them; effects/s is
 *    shipments created per second between the first and the last (claim + upsert each, up to FULFILMENT_BATCH_SIZE
 *    of them per transaction).
 * 2. Steady: BENCH_RATE (200) events/s for BENCH_SECONDS (20); lag is each shipment's created_at (its transaction's
 *    start) minus its event's occurredAt (the publish time): p50 / p99 / max.
 * Prints one `RESULT {json}` line. Numbers from a shared machine mean little: see bench/README.md.
 */
import type { ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect } from 'amqplib';
import pg from 'pg';
import { freePort } from '../src/common/free-port.js';
import { startEmbeddedPostgres } from '#service-kit/embedded-postgres';
import { startRabbitMq } from '../test/support/rabbitmq.js';
import { startConsumer } from './start-consumer.js';

const EVENTS = Number(process.env.BENCH_EVENTS ?? 5000);
const RATE = Number(process.env.BENCH_RATE ?? 200);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 20);
const DEADLINE_MS = 300_000;

/** `KEY=value KEY2=value2` → an env object (for BENCH_CONSUMER_ENV). */
const envPairs = (text: string): Record<string, string> =>
  Object.fromEntries(
    text
      .split(/\s+/)
      .filter(Boolean)
      .map((pair): [string, string] => [pair.slice(0, pair.indexOf('=')), pair.slice(pair.indexOf('=') + 1)]),
  );

async function main(): Promise<void> {
  if (process.env.AMQP_URL && process.env.DATABASE_URL) return measure(process.env.DATABASE_URL, process.env.AMQP_URL);
  if (process.env.AMQP_URL || process.env.DATABASE_URL)
    throw new Error('set both AMQP_URL and DATABASE_URL (a running consumer), or neither');
  const dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-bench-consumer-'));
  await chmod(dir, 0o755);
  const server = await startEmbeddedPostgres({ dir: join(dir, 'pg'), port: await freePort(), socket: true });
  const databaseUrl = server.socketUrl ?? server.url;
  let broker: Awaited<ReturnType<typeof startRabbitMq>> | undefined;
  let consumer: ChildProcess | undefined;
  try {
    broker = await startRabbitMq();
    const started = await startConsumer({
      DATABASE_URL: databaseUrl,
      AMQP_URL: broker.url,
      ...envPairs(process.env.BENCH_CONSUMER_ENV ?? ''),
    });
    consumer = started.child;
    console.log(started.banner);
    await measure(databaseUrl, broker.url);
  } finally {
    if (consumer && consumer.exitCode === null && consumer.signalCode === null) {
      consumer.kill('SIGTERM');
      await once(consumer, 'exit');
    }
    await broker?.stop();
    await server.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

async function measure(databaseUrl: string, amqpUrl: string): Promise<void> {
  const db = new pg.Pool({ connectionString: databaseUrl, max: 2 });
  const connection = await connect(amqpUrl);
  const channel = await connection.createConfirmChannel();
  await channel.assertExchange('orders.events', 'topic', { durable: true });
  const publish = (orderId: string) => {
    const eventId = randomUUID();
    const event = {
      eventId,
      type: 'order.paid',
      orderId,
      clientId: 'bench',
      orderVersion: 2,
      totalMinor: 1000,
      currency: 'EUR',
      occurredAt: new Date().toISOString(),
    };
    channel.publish('orders.events', 'order.paid', Buffer.from(JSON.stringify(event)), {
      persistent: true,
      contentType: 'application/json',
      messageId: eventId,
      type: 'order.paid',
      timestamp: Math.floor(Date.now() / 1000),
    });
  };
  const applied = async (orderIds: string[]) =>
    (await db.query<{ n: number }>('SELECT count(*)::int AS n FROM fulfilment.shipments WHERE order_id = ANY($1::uuid[])', [orderIds]))
      .rows[0].n;
  const waitFor = async (orderIds: string[]) => {
    const deadline = Date.now() + DEADLINE_MS;
    while ((await applied(orderIds)) < orderIds.length) {
      if (Date.now() > deadline) throw new Error('the consumer did not apply every event in time: is it running on these URLs?');
      await new Promise((r) => setTimeout(r, 100));
    }
  };

  try {
    const burst = Array.from({ length: EVENTS }, () => randomUUID());
    for (const orderId of burst) publish(orderId);
    await channel.waitForConfirms();
    await waitFor(burst);
    const {
      rows: [span],
    } = await db.query<{ seconds: number }>(
      'SELECT extract(epoch FROM max(created_at) - min(created_at))::float8 AS seconds FROM fulfilment.shipments WHERE order_id = ANY($1::uuid[])',
      [burst],
    );
    const effectsPerSecond = Math.round((EVENTS - 1) / Math.max(span.seconds, 0.001));
    console.log(`burst: ${EVENTS} events, ${effectsPerSecond} effects/s`);

    const steady: string[] = [];
    const publishedAt: number[] = [];
    const started = Date.now();
    for (let i = 0; i < RATE * SECONDS; i++) {
      // Paced against the clock, not by sleeping a fixed step: a late tick catches up instead of drifting.
      const due = started + (i * 1000) / RATE;
      if (due > Date.now()) await new Promise((r) => setTimeout(r, due - Date.now()));
      const orderId = randomUUID();
      steady.push(orderId);
      publishedAt.push(Date.now());
      publish(orderId);
    }
    await channel.waitForConfirms();
    await waitFor(steady);
    // Lag from each event's publish to its shipment's transaction (created_at = now() of that transaction).
    const {
      rows: [lag],
    } = await db.query<{ p50: number; p99: number; max: number }>(
      `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50, percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99, max(ms) AS max
         FROM (SELECT extract(epoch FROM s.created_at - p.published_at)::float8 * 1000 AS ms
                 FROM fulfilment.shipments s
                 JOIN unnest($1::uuid[], $2::timestamptz[]) AS p(order_id, published_at) USING (order_id)) x`,
      [steady, publishedAt.map((t) => new Date(t).toISOString())],
    );
    console.log(
      `steady: ${RATE} events/s for ${SECONDS} s, lag p50 ${lag.p50.toFixed(1)} ms, p99 ${lag.p99.toFixed(1)} ms, max ${lag.max.toFixed(1)} ms`,
    );
    console.log(
      `RESULT ${JSON.stringify({ events: EVENTS, effectsPerSecond, rate: RATE, lagP50Ms: lag.p50, lagP99Ms: lag.p99, lagMaxMs: lag.max })}`,
    );
  } finally {
    await channel.close().catch(() => undefined);
    await connection.close().catch(() => undefined);
    await db.end();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exitCode = 1;
});
