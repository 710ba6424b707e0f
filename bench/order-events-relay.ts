/**
 * npm run bench:relay — the order events relay (src/events/order-events-relay.ts) against a real RabbitMQ (Debian's
 * rabbitmq-server, started by the tests' harness) and an embedded PostgreSQL, the service as its own process:
 *
 * 1. throughput: BENCH_RELAY_EVENTS (20 000) due rows inserted at once; events/s until the last is confirmed and marked;
 * 2. lag: orders created over HTTP at a steady BENCH_RELAY_RATE (200/s) for BENCH_SECONDS (10); p50/p99/max of
 *    commit → marked sent (the confirm plus the mark: what `order_events_publish_lag_seconds` measures, read here
 *    exactly from the rows).
 *
 * A queue is bound to the exchange (durable, messages persistent), so the broker writes what a consumer would read.
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
import { applyMigrations } from '#service-kit';

const EVENTS = Number(process.env.BENCH_RELAY_EVENTS ?? 20_000);
const RATE = Number(process.env.BENCH_RELAY_RATE ?? 200);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 10);
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

async function main(): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-bench-relay-'));
  await chmod(dir, 0o755);
  const server = await startEmbeddedPostgres({ dir: join(dir, 'pg'), port: await freePort(), socket: true });
  const dbUrl = server.socketUrl ?? server.url;
  const broker = await startRabbitMq();
  let service: ChildProcess | undefined;
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

    // 2. Lag at a steady rate: one create (one order.created) every 1/RATE s.
    const body = JSON.stringify({ currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 2, unitPriceMinor: 1999 }] });
    const [{ mark }] = (await db.query<{ mark: Date }>(`SELECT clock_timestamp() AS mark`)).rows;
    const sends: Promise<Response>[] = [];
    const start = performance.now();
    for (let i = 0; i < RATE * SECONDS; i++) {
      const due = start + (i * 1000) / RATE;
      const wait = due - performance.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      const headers = { authorization: `Bearer ${SECRET}`, 'idempotency-key': randomUUID(), 'content-type': 'application/json' };
      sends.push(fetch(`${started.url}/orders`, { method: 'POST', headers, body }));
    }
    const answers = await Promise.all(sends);
    const failed = answers.filter((r) => r.status !== 201);
    if (failed.length) throw new Error(`${failed.length} creates answered ${failed[0].status}: ${await failed[0].text()}`);
    await until('the steady run drained', 60_000, async () => (await unsent()) === 0);
    const { rows } = await db.query<{ n: number; p50: number; p99: number; max: number }>(
      `SELECT count(*)::int AS n,
              percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50,
              percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99, max(ms) AS max
         FROM (SELECT (extract(epoch FROM sent_at - created_at) * 1000)::float8 AS ms FROM order_events_outbox WHERE created_at >= $1) l`,
      [mark],
    );
    const lag = rows[0];
    console.log(
      `lag at ${RATE} events/s for ${SECONDS} s: ${lag.n} events (every create 201), commit → marked sent ` +
        `p50 ${lag.p50.toFixed(1)} ms, p99 ${lag.p99.toFixed(1)} ms, max ${lag.max.toFixed(1)} ms`,
    );
    console.log(
      `queue bench.order-events holds ${(await broker.queueDepth('bench.order-events')).ready} messages (expected ${EVENTS + lag.n})`,
    );
  } finally {
    if (service && service.exitCode === null && service.signalCode === null) {
      service.kill('SIGTERM');
      await once(service, 'exit');
    }
    await db.end();
    await broker.stop();
    await server.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exitCode = 1;
});
