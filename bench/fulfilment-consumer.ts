/**
 * node dist/bench/fulfilment-consumer.js — the fulfilment consumer's throughput and lag, against a consumer that is
 * already running (`npm run start:fulfilment`) on AMQP_URL and DATABASE_URL (the same values as the consumer's).
 *
 * 1. Burst: BENCH_EVENTS (5000) `order.paid` published with confirms as fast as the broker takes them; effects/s is
 *    shipments created per second between the first and the last (each one its own transaction, claim + upsert).
 * 2. Steady: BENCH_RATE (200) events/s for BENCH_SECONDS (20); lag is each shipment's created_at (its transaction's
 *    start) minus its event's occurredAt (the publish time): p50 / p99 / max.
 * Prints one `RESULT {json}` line. Numbers from a shared machine mean little: see bench/README.md.
 */
import { randomUUID } from 'node:crypto';
import { connect } from 'amqplib';
import pg from 'pg';

const EVENTS = Number(process.env.BENCH_EVENTS ?? 5000);
const RATE = Number(process.env.BENCH_RATE ?? 200);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 20);
const DEADLINE_MS = 300_000;

function required(name: string): string {
  const value = process.env[name];
  if (!value) {
    console.error(`${name} must be set (the running consumer's own)`);
    process.exit(1);
  }
  return value;
}

async function main(): Promise<void> {
  const db = new pg.Pool({ connectionString: required('DATABASE_URL'), max: 2 });
  const connection = await connect(required('AMQP_URL'));
  const channel = await connection.createConfirmChannel();
  await channel.assertExchange('orders.events', 'topic', { durable: true });
  const publish = (orderId: string) => {
    const eventId = randomUUID();
    const event = { eventId, type: 'order.paid', orderId, clientId: 'bench', orderVersion: 2, totalMinor: 1000, currency: 'EUR', occurredAt: new Date().toISOString() };
    channel.publish('orders.events', 'order.paid', Buffer.from(JSON.stringify(event)), {
      persistent: true,
      contentType: 'application/json',
      messageId: eventId,
      type: 'order.paid',
      timestamp: Math.floor(Date.now() / 1000),
    });
  };
  const applied = async (orderIds: string[]) =>
    (await db.query<{ n: number }>('SELECT count(*)::int AS n FROM fulfilment.shipments WHERE order_id = ANY($1::uuid[])', [orderIds])).rows[0].n;
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
    const { rows: [span] } = await db.query<{ seconds: number }>(
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
    const { rows: [lag] } = await db.query<{ p50: number; p99: number; max: number }>(
      `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50, percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99, max(ms) AS max
         FROM (SELECT extract(epoch FROM s.created_at - p.published_at)::float8 * 1000 AS ms
                 FROM fulfilment.shipments s
                 JOIN unnest($1::uuid[], $2::timestamptz[]) AS p(order_id, published_at) USING (order_id)) x`,
      [steady, publishedAt.map((t) => new Date(t).toISOString())],
    );
    console.log(`steady: ${RATE} events/s for ${SECONDS} s, lag p50 ${lag.p50.toFixed(1)} ms, p99 ${lag.p99.toFixed(1)} ms, max ${lag.max.toFixed(1)} ms`);
    console.log(`RESULT ${JSON.stringify({ events: EVENTS, effectsPerSecond, rate: RATE, lagP50Ms: lag.p50, lagP99Ms: lag.p99, lagMaxMs: lag.max })}`);
  } finally {
    await channel.close().catch(() => undefined);
    await connection.close().catch(() => undefined);
    await db.end();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
