/**
 * npm run bench — throughput and latency of the idempotency layer, each beside what the database
 * allows for the same work (the same SQL straight through `pg`) and the framework's floor
 * (GET /health), as ratios measured in one run on one machine.
 *
 * The service runs as its own process (as in production); load comes from this process.
 */
import autocannon from 'autocannon';
import { type ChildProcess, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtemp, rm, chmod } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { DataSource } from 'typeorm';
import { applyMigrations } from '../src/database/apply-migrations.js';
import { startEmbeddedPostgres } from '../src/database/embedded-postgres.js';
import { typeormOptions } from '../src/database/typeorm-options.js';

const CONNECTIONS = 32;
const DURATION_S = Number(process.env.BENCH_SECONDS ?? 8);
const STORM_WIDTH = 50;
const STORM_ROUNDS = 100;
const SECRET = 'bench-secret-0123456789';
const BODY = JSON.stringify({ currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 2, unitPriceMinor: 1999 }, { sku: 'SKU-2', quantity: 1, unitPriceMinor: 500 }] });

interface Row {
  name: string;
  rps: number;
  p50: number;
  p99: number;
  errors: number;
}

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

async function cannon(name: string, url: string, opts: Partial<autocannon.Options>): Promise<Row> {
  const result = await autocannon({ url, connections: CONNECTIONS, duration: DURATION_S, ...opts });
  const errors = result.errors + result.timeouts + result.non2xx;
  return { name, rps: result.requests.average, p50: result.latency.p50, p99: result.latency.p99, errors };
}

/** The service's SQL for one idempotent create, issued directly: fast-path read, claim, savepoint, order + lines, record, commit. */
async function directCreates(url: string): Promise<Row> {
  const pool = new pg.Pool({ connectionString: url, max: 20 });
  const claim = `WITH claimed AS (INSERT INTO idempotency_keys (client_id, key, fingerprint, request_method, request_path, expires_at)
      VALUES ($1, $2, $3, 'POST', '/orders', now() + make_interval(secs => 86400)) ON CONFLICT ON CONSTRAINT uq_idempotency_keys_client_key DO NOTHING
      RETURNING id, true AS claimed) SELECT * FROM claimed UNION ALL SELECT id, false FROM idempotency_keys WHERE client_id = $1 AND key = $2`;
  const insertOrder = `WITH o AS (INSERT INTO orders (client_id, order_number, currency, total_minor, shipping_address, note) VALUES ($1, $2, 'EUR', 4498, NULL, NULL)
      ON CONFLICT ON CONSTRAINT uq_orders_client_order_number DO NOTHING RETURNING *),
      lines AS (INSERT INTO order_items (order_id, line_no, sku, quantity, unit_price_minor)
      SELECT o.id, l.line_no, l.sku, l.quantity, l.unit_price_minor FROM o, unnest($3::text[], $4::int[], $5::bigint[]) WITH ORDINALITY AS l(sku, quantity, unit_price_minor, line_no))
      SELECT o.* FROM o`;
  const latencies: number[] = [];
  let errors = 0;
  const deadline = performance.now() + DURATION_S * 1000;
  const worker = async () => {
    while (performance.now() < deadline) {
      const started = performance.now();
      const client = await pool.connect();
      try {
        // The replay fast path's read, which misses for a new key.
        await client.query(`SELECT id, fingerprint, state FROM idempotency_keys WHERE client_id = $1 AND key = $2`, ['bench', randomUUID()]);
        await client.query('BEGIN');
        const { rows } = await client.query<{ id: string }>(claim, ['bench', randomUUID(), 'f']);
        await client.query('SAVEPOINT idempotent_handler');
        await client.query(insertOrder, ['bench', `ord_${randomUUID()}`, ['SKU-1', 'SKU-2'], [2, 1], [1999, 500]]);
        await client.query(`UPDATE idempotency_keys SET state = 'completed', response_status = 201, response_headers = $2, response_body = $3, completed_at = now() WHERE id = $1`, [
          rows[0].id,
          { 'content-type': 'application/json; charset=utf-8' },
          BODY,
        ]);
        await client.query('COMMIT');
      } catch {
        errors++;
        await client.query('ROLLBACK').catch(() => undefined);
      } finally {
        client.release();
      }
      latencies.push(performance.now() - started);
    }
  };
  await Promise.all(Array.from({ length: CONNECTIONS }, worker));
  await pool.end();
  latencies.sort((a, b) => a - b);
  return { name: 'same SQL straight through pg', rps: latencies.length / DURATION_S, p50: percentile(latencies, 50), p99: percentile(latencies, 99), errors };
}

async function post(url: string, key: string): Promise<{ status: number; ms: number }> {
  const started = performance.now();
  const res = await fetch(`${url}/orders`, {
    method: 'POST',
    headers: { authorization: `Bearer ${SECRET}`, 'idempotency-key': key, 'content-type': 'application/json' },
    body: BODY,
  });
  await res.arrayBuffer();
  return { status: res.status, ms: performance.now() - started };
}

/** STORM_ROUNDS rounds of STORM_WIDTH simultaneous requests sharing one new key. */
async function storm(url: string): Promise<{ storm: Row; alone: Row }> {
  const alone: number[] = [];
  for (let i = 0; i < 200; i++) alone.push((await post(url, randomUUID())).ms);
  const latencies: number[] = [];
  let errors = 0;
  const started = performance.now();
  for (let round = 0; round < STORM_ROUNDS; round++) {
    const key = randomUUID();
    const results = await Promise.all(Array.from({ length: STORM_WIDTH }, () => post(url, key)));
    for (const r of results) {
      latencies.push(r.ms);
      if (r.status !== 201) errors++;
    }
  }
  const seconds = (performance.now() - started) / 1000;
  latencies.sort((a, b) => a - b);
  alone.sort((a, b) => a - b);
  return {
    storm: { name: `${STORM_WIDTH}-way duplicate storm (${STORM_ROUNDS} rounds)`, rps: latencies.length / seconds, p50: percentile(latencies, 50), p99: percentile(latencies, 99), errors },
    alone: { name: 'uncontended create (1 connection)', rps: alone.length / (alone.reduce((a, b) => a + b, 0) / 1000), p50: percentile(alone, 50), p99: percentile(alone, 99), errors: 0 },
  };
}

/** More created orders than a pay run can use up: each pay needs an order of its own. */
const PAY_ORDERS = 20_000;

/** POST /orders/:id/payments with tok_visa, a new key and a new order each: phases 1 and 3 plus two HTTP round trips to the in-process sandbox. */
async function pays(url: string, databaseUrl: string): Promise<Row> {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 1 });
  const { rows } = await pool.query<{ id: string }>(
    `INSERT INTO orders (client_id, order_number, currency, total_minor) SELECT 'bench', 'pay-' || g, 'EUR', 4498 FROM generate_series(1, $1) g RETURNING id`,
    [PAY_ORDERS],
  );
  await pool.end();
  let next = 0;
  return cannon('pay with tok_visa (new key and order each)', `${url}/orders`, {
    method: 'POST',
    headers: { authorization: `Bearer ${SECRET}`, 'content-type': 'application/json' },
    body: JSON.stringify({ source: 'tok_visa' }),
    requests: [
      {
        setupRequest: (req) => ({ ...req, path: `/orders/${rows[next++ % rows.length].id}/payments`, headers: { ...req.headers, 'idempotency-key': randomUUID() } }),
      },
    ],
  });
}

async function main(): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-bench-'));
  await chmod(dir, 0o755);
  console.error('starting PostgreSQL');
  const server = await startEmbeddedPostgres({ dir: join(dir, 'pg'), port: 54000 + Math.floor(Math.random() * 900), log: (l) => process.env.BENCH_DEBUG && console.error(l) });
  let service: ChildProcess | undefined;
  try {
    // Two connections: applyMigrations holds one for its advisory lock while TypeORM migrates on another.
    const setup = new DataSource(typeormOptions(server.url, { lockTimeoutMs: 10_000, poolSize: 2 }));
    await setup.initialize();
    await applyMigrations(setup);
    console.error('migrated; starting the service');
    await setup.destroy();

    // BENCH_SERVICE_ARGS='--cpu-prof' profiles the service while it is measured.
    const nodeArgs = process.env.BENCH_SERVICE_ARGS?.split(' ').filter(Boolean) ?? [];
    service = spawn(process.execPath, [...nodeArgs, fileURLToPath(new URL('../src/main.js', import.meta.url))], {
      env: { PATH: process.env.PATH, PORT: '0', DATABASE_URL: server.url, API_KEYS: `bench:${SECRET}`, PSP_WEBHOOK_SECRET: `whsec_${Buffer.from(SECRET).toString('base64')}`, LOG_LEVEL: 'warn' },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const url = await new Promise<string>((res, rej) => {
      let out = '';
      service!.stdout!.on('data', (c: Buffer) => {
        out += c.toString();
        const m = /listening on (http:\/\/localhost:\d+)/.exec(out);
        if (m) res(m[1].replace('localhost', '127.0.0.1'));
      });
      service!.once('exit', (code) => rej(new Error(`service exited ${code}`)));
    });
    const headers = { authorization: `Bearer ${SECRET}`, 'content-type': 'application/json' };

    console.error(`service at ${url}; measuring`);
    // Warm-up: JIT, pool, caches.
    await cannon('warm-up', `${url}/health`, { duration: 2 });

    const rows: Row[] = [];
    rows.push(await cannon('GET /health', `${url}/health`, {}));
    const created = await cannon('idempotent create (new key each)', `${url}/orders`, {
      method: 'POST',
      headers,
      body: BODY,
      requests: [{ setupRequest: (req) => ({ ...req, headers: { ...req.headers, 'idempotency-key': randomUUID() } }) }],
    });
    rows.push(created);
    rows.push(await directCreates(server.url));
    const replayKeys = Array.from({ length: 100 }, () => randomUUID());
    for (const key of replayKeys) await post(url, key);
    let next = 0;
    rows.push(
      await cannon('replay of a completed key', `${url}/orders`, {
        method: 'POST',
        headers,
        body: BODY,
        requests: [{ setupRequest: (req) => ({ ...req, headers: { ...req.headers, 'idempotency-key': replayKeys[next++ % replayKeys.length] } }) }],
      }),
    );
    const { storm: stormRow, alone } = await storm(url);
    rows.push(alone, stormRow);
    rows.push(await pays(url, server.url));

    const byName = (n: string) => rows.find((r) => r.name.startsWith(n))!;
    console.log(`\n${CONNECTIONS} connections, ${DURATION_S} s each (storm: ${STORM_WIDTH} at once)\n`);
    console.log('| workload | req/s | p50 ms | p99 ms | errors |\n|---|---:|---:|---:|---:|');
    for (const r of rows) console.log(`| ${r.name} | ${r.rps.toFixed(0)} | ${r.p50.toFixed(1)} | ${r.p99.toFixed(1)} | ${r.errors} |`);
    console.log(`\ncreate / same SQL through pg: ${(byName('idempotent create').rps / byName('same SQL').rps).toFixed(2)}×`);
    console.log(`replay / GET /health:         ${(byName('replay').rps / byName('GET /health').rps).toFixed(2)}×`);
    console.log(`storm p99 / uncontended p50:  ${(stormRow.p99 / alone.p50).toFixed(2)}× (storm errors: ${stormRow.errors})`);
  } finally {
    if (service && service.exitCode === null) {
      const exited = new Promise((r) => service!.once('exit', r));
      service.kill('SIGTERM');
      await exited;
    }
    await server.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
