/**
 * npm run bench:relay — the order events relay (src/events/order-events-relay.ts) against a real RabbitMQ (Debian's
 * rabbitmq-server, started by the tests' harness) and an embedded PostgreSQL, the service as its own process:
 *
 * 1. throughput: BENCH_RELAY_EVENTS (20 000) due rows inserted at once; events/s until the last is confirmed and marked
 *    (into a durable queue bound by the bench, so the broker writes what a consumer would read);
 * 2. end-to-end lag: the fulfilment consumer (dist/apps/fulfilment/src/main.js, its own process and its own database
 *    `fulfilment` on the same PostgreSQL server, its defaults) consumes fulfilment.order-events while orders are
 *    created over HTTP at a steady BENCH_RELAY_RATE (200) events/s for BENCH_SECONDS (10) — each create one
 *    order.created; with BENCH_RELAY_LOAD=create-pay each order is also paid (2 events: RATE/2 orders/s; on 2 cores
 *    pays at 100/s exceed what the machine can do with the sandbox in-process). p50/p99/max of (a) commit → marked
 *    sent, every event (the confirm plus the mark: what `order_events_publish_lag_seconds` measures, read here
 *    exactly from the rows), (b) commit → the consumer's mark committed, every event (the whole path), and with pays
 *    (c) order.paid → shipment committed. The bench's queue is unbound first: the consumer's quorum queue is what the
 *    broker writes then.
 *
 * The timestamps, all from the one PostgreSQL server's clock (both databases live on it, so no clock skew):
 * an outbox row's created_at is clock_timestamp() in the pay's transition statement for order.paid (the create's
 * now() for order.created), a few ms at most before that transaction's COMMIT; sent_at is now() of the mark's
 * transaction, which commits right after; a shipment's created_at is now() of the consumer's batch transaction, i.e.
 * its BEGIN, before the claim, the upsert and the COMMIT, and so is a mark's processed_at. So (b) and (c) leave out
 * the consumer transaction's own duration (about a millisecond at these rates) and count the pay transaction's tail
 * after its statement.
 * Numbers are only meaningful on a machine nobody else is using.
 */
import amqplib from 'amqplib';
import { type ChildProcess, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { DataSource } from 'typeorm';
import { freePort } from '../src/common/free-port.js';
import { startEmbeddedPostgres } from '#service-kit/embedded-postgres';
import { typeormOptions } from '../src/database/typeorm-options.js';
import { startRabbitMq } from '../test/support/rabbitmq.js';
import { startConsumer } from './start-consumer.js';
import { applyMigrations } from '#service-kit';

const EVENTS = Number(process.env.BENCH_RELAY_EVENTS ?? 20_000);
const RATE = Number(process.env.BENCH_RELAY_RATE ?? 200);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 10);
const WITH_PAYS = process.env.BENCH_RELAY_LOAD === 'create-pay';
const SECRET = 'bench-secret-0123456789';
const WEBHOOK_SECRET = `whsec_${Buffer.from('bench-relay-webhook-secret-32-by').toString('base64')}`;

async function until(what: string, deadlineMs: number, done: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + deadlineMs;
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`not within ${deadlineMs} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function startService(env: Record<string, string>): Promise<{ child: ChildProcess; url: string }> {
  const child = spawn(process.execPath, [fileURLToPath(new URL('../src/main.js', import.meta.url))], {
    env: { PATH: process.env.PATH ?? '', PORT: '0', LOG_LEVEL: 'warn', ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let output = '';
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout.on('data', (chunk: Buffer) => {
      output += chunk.toString();
      const match = /listening on (http:\/\/localhost:\d+)/.exec(output);
      if (match) resolve(match[1].replace('localhost', '127.0.0.1'));
    });
    child.once('exit', (code) => reject(new Error(`service exited ${code}:\n${output}`)));
  });
  return { child, url };
}

/** The same server's URL (TCP or its socket's `?host=` form) with another database. */
function databaseNamed(url: string, name: string): string {
  const parsed = new URL(url);
  parsed.pathname = `/${name}`;
  return parsed.toString();
}

/** p50 / p99 / max of a list of ms, the same interpolation as PostgreSQL's percentile_cont. */
function percentiles(values: number[]): { n: number; p50: number; p99: number; max: number } {
  const sorted = [...values].sort((a, b) => a - b);
  const at = (q: number) => {
    const i = q * (sorted.length - 1);
    const lo = Math.floor(i);
    return sorted[lo] + (sorted[Math.min(lo + 1, sorted.length - 1)] - sorted[lo]) * (i - lo);
  };
  return { n: sorted.length, p50: at(0.5), p99: at(0.99), max: sorted[sorted.length - 1] };
}

const summary = (l: { p50: number; p99: number; max: number }) =>
  `p50 ${l.p50.toFixed(1)} ms, p99 ${l.p99.toFixed(1)} ms, max ${l.max.toFixed(1)} ms`;

/**
 * RATE events/s as RATE creates/s (order.created), or with pays RATE/2 orders/s each created and then paid, paced
 * against the clock (a late tick catches up instead of drifting); then waits until every event is marked sent and
 * marked processed by the consumer (and every paid order has its shipment), and reports (a), (b) and (c).
 */
async function measureLag(
  url: string,
  db: pg.Pool,
  shipmentsDb: pg.Pool,
  unsent: () => Promise<number>,
  broker: Awaited<ReturnType<typeof startRabbitMq>>,
): Promise<void> {
  const body = JSON.stringify({ currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 2, unitPriceMinor: 1999 }] });
  const pay = JSON.stringify({ source: 'tok_visa' });
  /**
   * A POST that a 503 (overloaded: every connection busy; payment-pending: the sandbox did not answer within
   * PSP_TIMEOUT_MS), a lost connection, or a 409 idempotency-key-in-use (the retry of a lost connection met the first
   * request still running) sends again with the same Idempotency-Key after Retry-After, as a client must; counted apart.
   */
  const retried: Record<string, number> = {};
  const post = async (path: string, payload: string): Promise<string> => {
    const headers = { authorization: `Bearer ${SECRET}`, 'idempotency-key': randomUUID(), 'content-type': 'application/json' };
    for (;;) {
      // A keep-alive connection the service closed as this request went out (ECONNRESET): the same key, again.
      const answer = await fetch(`${url}${path}`, { method: 'POST', headers, body: payload }).catch((err: unknown) => err as Error);
      if (answer instanceof Error) {
        retried['connection lost'] = (retried['connection lost'] ?? 0) + 1;
        await new Promise((r) => setTimeout(r, 100));
        continue;
      }
      const text = await answer.text();
      if (answer.status === 201) return text;
      const problem = answer.status === 503 || answer.status === 409 ? (JSON.parse(text) as { type?: string }).type : undefined;
      if (answer.status !== 503 && !problem?.endsWith(':idempotency-key-in-use')) {
        throw new Error(`POST ${path} answered ${answer.status}: ${text}`);
      }
      const kind = `${path.endsWith('/payments') ? 'pay' : 'create'} ${answer.status} ${problem?.split(':').pop()}`;
      retried[kind] = (retried[kind] ?? 0) + 1;
      await new Promise((r) => setTimeout(r, Number(answer.headers.get('retry-after') ?? 1) * 1000));
    }
  };
  const eventsPerOrder = WITH_PAYS ? 2 : 1;
  const createAndPay = async (): Promise<string> => {
    const { id } = JSON.parse(await post('/orders', body)) as { id: string };
    if (WITH_PAYS) await post(`/orders/${id}/payments`, pay);
    return id;
  };
  const [{ mark }] = (await db.query<{ mark: Date }>(`SELECT clock_timestamp() AS mark`)).rows;
  const orders: Promise<string>[] = [];
  const orderCount = Math.round((RATE * SECONDS) / eventsPerOrder);
  const start = performance.now();
  for (let i = 0; i < orderCount; i++) {
    const wait = start + (i * 1000 * eventsPerOrder) / RATE - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    orders.push(createAndPay());
  }
  const paced = (performance.now() - start) / 1000;
  const orderIds = await Promise.all(orders);
  const answered = (performance.now() - start) / 1000;
  await until('every event marked sent', 60_000, async () => (await unsent()) === 0);
  const shipped = async () =>
    (
      await shipmentsDb.query<{ n: number }>(`SELECT count(*)::int AS n FROM fulfilment.shipments WHERE order_id = ANY($1::uuid[])`, [
        orderIds,
      ])
    ).rows[0].n;
  if (WITH_PAYS) await until('a shipment for every paid order', 60_000, async () => (await shipped()) === orderIds.length);

  const { rows: events } = await db.query<{ event_id: string; type: string; order_id: string; created: number; sent_ms: number }>(
    `SELECT event_id, type, order_id, extract(epoch FROM created_at)::float8 * 1000 AS created,
            extract(epoch FROM sent_at - created_at)::float8 * 1000 AS sent_ms
       FROM order_events_outbox WHERE created_at >= $1`,
    [mark],
  );
  if (events.length !== eventsPerOrder * orderIds.length) throw new Error(`${events.length} events for ${orderIds.length} orders`);
  const eventIds = events.map((e) => e.event_id);
  const processedCount = async () =>
    (
      await shipmentsDb.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM fulfilment.processed_messages WHERE consumer = 'fulfilment' AND message_id = ANY($1)`,
        [eventIds],
      )
    ).rows[0].n;
  await until('every event marked processed by the consumer', 60_000, async () => (await processedCount()) === events.length);
  const { rows: processed } = await shipmentsDb.query<{ message_id: string; at: number }>(
    `SELECT message_id, extract(epoch FROM processed_at)::float8 * 1000 AS at
       FROM fulfilment.processed_messages WHERE consumer = 'fulfilment' AND message_id = ANY($1)`,
    [eventIds],
  );
  const committedAt = new Map(events.map((e) => [e.event_id, e.created]));
  const consumed = percentiles(processed.map((p) => p.at - committedAt.get(p.message_id)!));
  const paidAt = new Map(events.filter((e) => e.type === 'order.paid').map((e) => [e.order_id, e.created]));
  const { rows: shipments } = await shipmentsDb.query<{ order_id: string; created: number }>(
    `SELECT order_id, extract(epoch FROM created_at)::float8 * 1000 AS created FROM fulfilment.shipments WHERE order_id = ANY($1::uuid[])`,
    [orderIds],
  );
  const marked = percentiles(events.map((e) => e.sent_ms));
  // The rate the events were committed at, which is RATE only while the service keeps up with the pace.
  const committed = events.map((e) => e.created);
  const committedSeconds = (Math.max(...committed) - Math.min(...committed)) / 1000;
  const endToEnd = percentiles(shipments.map((s) => s.created - paidAt.get(s.order_id)!));
  console.log(
    `lag at ${RATE} events/s for ${SECONDS} s (${orderIds.length} orders created${WITH_PAYS ? ' and paid' : ''}, ${events.length} events, ` +
      `sent over ${paced.toFixed(1)} s, the last answered at ${answered.toFixed(1)} s, every one 201 in the end; ` +
      `503s retried: ${JSON.stringify(retried)}); the events committed over ${committedSeconds.toFixed(1)} s = ` +
      `${Math.round(events.length / committedSeconds)} events/s:`,
  );
  console.log(`  (a) commit → marked sent, every event: ${summary(marked)}`);
  console.log(`  (b) commit → the consumer's mark committed, every event (end to end): ${summary(consumed)}`);
  if (WITH_PAYS) console.log(`  (c) order.paid → shipment committed, ${endToEnd.n} shipments: ${summary(endToEnd)}`);
  const result = {
    rate: RATE,
    seconds: SECONDS,
    events: events.length,
    committedSeconds,
    retried,
    markedSent: marked,
    consumed,
    paidToShipment: WITH_PAYS ? endToEnd : undefined,
  };
  console.log(`RESULT ${JSON.stringify(result)}`);
  const depth = await broker.queueDepth('fulfilment.order-events');
  console.log(`queue fulfilment.order-events: ${depth.ready} ready, ${depth.unacked} unacked (the broker's counts lag by up to 500 ms)`);
}

async function main(): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-bench-relay-'));
  await chmod(dir, 0o755);
  const server = await startEmbeddedPostgres({ dir: join(dir, 'pg'), port: await freePort(), socket: true });
  const dbUrl = server.socketUrl ?? server.url;
  const broker = await startRabbitMq();
  let service: ChildProcess | undefined;
  let consumer: ChildProcess | undefined;
  const db = new pg.Pool({ connectionString: dbUrl, max: 4 });
  try {
    const setup = new DataSource(typeormOptions(dbUrl, { lockTimeoutMs: 10_000, poolSize: 2 }));
    await setup.initialize();
    await applyMigrations(setup);
    await setup.destroy();

    const mq = await amqplib.connect(broker.url);
    const channel = await mq.createChannel();
    await channel.assertExchange('orders.events', 'topic', { durable: true });
    await channel.assertQueue('bench.order-events', { durable: true });
    await channel.bindQueue('bench.order-events', 'orders.events', 'order.*');
    await mq.close();

    const started = await startService({
      DATABASE_URL: dbUrl,
      API_KEYS: `bench:${SECRET}`,
      PSP_WEBHOOK_SECRET: WEBHOOK_SECRET,
      PSP_API_KEY: `sk_test_${SECRET}`,
      PSP_SANDBOX: 'in-process',
      AMQP_URL: broker.url,
    });
    service = started.child;
    const unsent = async () =>
      (await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM order_events_outbox WHERE sent_at IS NULL`)).rows[0].n;

    // 1. Throughput: a backlog of EVENTS rows, as after an outage.
    await db.query(
      `INSERT INTO order_events_outbox (event_id, type, order_id, client_id, order_version, payload)
       SELECT id, 'order.created', gen_random_uuid(), 'bench', 1,
              jsonb_build_object('eventId', id, 'type', 'order.created', 'orderId', gen_random_uuid(), 'clientId', 'bench',
                                 'orderVersion', 1, 'totalMinor', 4498, 'currency', 'EUR', 'occurredAt', now())
         FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, $1)) g`,
      [EVENTS],
    );
    const t0 = performance.now();
    await until('the backlog drained', 600_000, async () => (await unsent()) === 0);
    const seconds = (performance.now() - t0) / 1000;
    console.log(
      `relay throughput: ${EVENTS} events in ${seconds.toFixed(2)} s = ${Math.round(EVENTS / seconds)} events/s (confirmed and marked)`,
    );

    await until('the bench queue holds the backlog', 10_000, async () => (await broker.queueDepth('bench.order-events')).ready === EVENTS);

    // 2. End-to-end lag at a steady rate: the consumer on its own database, the bench's queue out of the way.
    await db.query(`CREATE DATABASE fulfilment`);
    const fulfilmentUrl = databaseNamed(dbUrl, 'fulfilment');
    const unbind = await amqplib.connect(broker.url);
    await (await unbind.createChannel()).unbindQueue('bench.order-events', 'orders.events', 'order.*');
    await unbind.close();
    consumer = (await startConsumer({ DATABASE_URL: fulfilmentUrl, AMQP_URL: broker.url })).child;
    const shipmentsDb = new pg.Pool({ connectionString: fulfilmentUrl, max: 2 });
    try {
      await measureLag(started.url, db, shipmentsDb, unsent, broker);
    } finally {
      await shipmentsDb.end();
    }
  } finally {
    for (const child of [consumer, service]) {
      if (child && child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM');
        await once(child, 'exit');
      }
    }
    await db.end();
    await broker.stop();
    await server.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  console.error(err);
  // Not process.exitCode: embedded-postgres' exit hook (async-exit-hook) ends the process with 0 on beforeExit.
  // The finally blocks have stopped everything by now.
  process.exit(1);
});
