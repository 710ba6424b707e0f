/**
 * The pieces of `npm run bench` (bench.ts) that other benchmarks run the same way (ha.ts): the load (autocannon rows
 * for create and pay), the CPU each row cost from /proc, and the processes measured — the service as `npm start` runs
 * it, the sandbox provider as a process of its own on an embedded PostgreSQL of its own. Nothing here runs on import.
 */
import autocannon from 'autocannon';
import { type ChildProcess, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { freePort } from '../src/common/free-port.js';
import { startEmbeddedPostgres } from '#service-kit/embedded-postgres';
import { postgresCpuMs, processCpuMs } from './proc-cpu.js';

export const CONNECTIONS = 32;
export const DURATION_S = Number(process.env.BENCH_SECONDS ?? 8);
export const SECRET = 'bench-secret-0123456789';
export const BODY = JSON.stringify({
  currency: 'EUR',
  items: [
    { sku: 'SKU-1', quantity: 2, unitPriceMinor: 1999 },
    { sku: 'SKU-2', quantity: 1, unitPriceMinor: 500 },
  ],
});

export interface Row {
  name: string;
  rps: number;
  p50: number;
  p99: number;
  errors: number;
  /** Requests (or transactions) completed: the divisor of the CPU columns. */
  requests: number;
  /** ms of CPU per request: the service process, and PostgreSQL (undefined where no service is involved). */
  serviceCpuMs?: number;
  pgCpuMs?: number;
  /** ms of CPU per request of the out-of-process sandbox provider and of its own PostgreSQL (pay only). */
  sandboxCpuMs?: number;
  sandboxPgCpuMs?: number;
}

/** The processes whose CPU is sampled around each workload. */
export interface CpuTargets {
  servicePid?: number;
  postmaster: number;
  sandbox?: { pid: number; postmaster: number };
}

/** Runs one workload and adds the CPU it cost per request, sampled from /proc before and after. */
export async function withCpu(targets: CpuTargets, workload: () => Promise<Row>): Promise<Row> {
  const service0 = processCpuMs(targets.servicePid);
  const pg0 = postgresCpuMs(targets.postmaster);
  const sandbox0 = targets.sandbox && [processCpuMs(targets.sandbox.pid), postgresCpuMs(targets.sandbox.postmaster)];
  const row = await workload();
  const service = processCpuMs(targets.servicePid) - service0;
  const pgMs = postgresCpuMs(targets.postmaster) - pg0;
  const per = (ms: number) => (row.requests > 0 ? ms / row.requests : NaN);
  const sandbox =
    targets.sandbox && sandbox0
      ? {
          sandboxCpuMs: per(processCpuMs(targets.sandbox.pid) - sandbox0[0]),
          sandboxPgCpuMs: per(postgresCpuMs(targets.sandbox.postmaster) - sandbox0[1]),
        }
      : {};
  return { ...row, serviceCpuMs: targets.servicePid ? per(service) : undefined, pgCpuMs: per(pgMs), ...sandbox };
}

export function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

export async function cannon(name: string, url: string, opts: Partial<autocannon.Options>): Promise<Row> {
  const result = await autocannon({ url, connections: CONNECTIONS, duration: DURATION_S, ...opts });
  const errors = result.errors + result.timeouts + result.non2xx;
  return { name, rps: result.requests.average, p50: result.latency.p50, p99: result.latency.p99, errors, requests: result.requests.total };
}

/** More created orders than a pay run can use up: each pay needs an order of its own. */
export const PAY_ORDERS = 20_000;

/** Of those, the orders the pay row's 2 s warm-up pays (more than it can use up at any rate measured so far). */
export const PAY_WARM_UP_ORDERS = 2_000;

/**
 * The orders a pay row pays, inserted before its CPU is sampled: 20,000 INSERTs (with their CHECKs, indexes and the
 * autovacuum they set off) are the bench's fixture, not a pay's cost. Numbers of the row's own (pay-c32-…, pay-c4-…).
 */
export async function payOrders(databaseUrl: string, connections: number): Promise<string[]> {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 1 });
  try {
    const { rows } = await pool.query<{ id: string }>(
      `INSERT INTO orders (client_id, order_number, currency, total_minor) SELECT 'bench', $2 || g, 'EUR', 4498 FROM generate_series(1, $1) g RETURNING id`,
      [PAY_ORDERS, `pay-c${connections}-`],
    );
    // Vacuumed and analysed now, as autovacuum would (20,000 inserts pass its thresholds) in the middle of the row.
    await pool.query('VACUUM (ANALYZE) orders');
    return rows.map((r) => r.id);
  } finally {
    await pool.end();
  }
}

/** POST /orders/:id/payments with tok_visa, a new key and a new order each: phases 1 and 3, the call to the sandbox, its webhook. */
export async function pays(url: string, orderIds: string[], name: string, connections = CONNECTIONS, duration = DURATION_S): Promise<Row> {
  let next = 0;
  return cannon(name, `${url}/orders`, {
    connections,
    duration,
    method: 'POST',
    headers: { authorization: `Bearer ${SECRET}`, 'content-type': 'application/json' },
    body: JSON.stringify({ source: 'tok_visa' }),
    requests: [
      {
        setupRequest: (req) => ({
          ...req,
          path: `/orders/${orderIds[next++ % orderIds.length]}/payments`,
          headers: { ...req.headers, 'idempotency-key': randomUUID() },
        }),
      },
    ],
  });
}

/** The URL a started service (or sandbox) prints once it listens. */
export function listeningUrl(child: ChildProcess): Promise<string> {
  return new Promise<string>((res, rej) => {
    let out = '';
    child.stdout!.on('data', (c: Buffer) => {
      out += c.toString();
      const m = /listening on (http:\/\/localhost:\d+)/.exec(out);
      if (m) res(m[1].replace('localhost', '127.0.0.1'));
    });
    child.once('exit', (code) => rej(new Error(`${child.spawnargs.at(-1)} exited ${code}`)));
  });
}

/** The webhook secret both sides hold: the sandbox signs its webhooks with it, the service checks them. */
export const WEBHOOK_SECRET = `whsec_${Buffer.from(SECRET).toString('base64')}`;

/** The provider key both sides hold (required with DATABASE_URL): the sandbox takes it, the service sends it. */
export const PROVIDER_KEY = `sk_test_${SECRET}`;

/** POST /orders with BODY under a new Idempotency-Key each: the create row's requests. */
export const CREATE_WITH_NEW_KEYS: Partial<autocannon.Options> = {
  method: 'POST',
  headers: { authorization: `Bearer ${SECRET}`, 'content-type': 'application/json' },
  body: BODY,
  requests: [{ setupRequest: (req) => ({ ...req, headers: { ...req.headers, 'idempotency-key': randomUUID() } }) }],
};

/**
 * Warm-up: JIT, pool, caches; and the create path (JIT, each pooled connection's first parse of the named statements),
 * as the peer's is warmed: otherwise that one-off cost lands in the first measured row.
 */
export async function warmUp(url: string): Promise<void> {
  await cannon('warm-up', `${url}/health`, { duration: 2 });
  await cannon('warm-up', `${url}/orders`, { duration: 2, ...CREATE_WITH_NEW_KEYS });
}

/**
 * The orders a pay row at `connections` pays, inserted (payOrders), then the row warmed up on orders of its own, as
 * the create path is warmed: each pooled connection's first runs of the pay path's statements (cold catalogue caches,
 * five custom plans before a generic one) are a one-off, not a pay's cost. Returns the orders left for the row.
 */
export async function warmedPayOrders(url: string, databaseUrl: string, connections: number): Promise<string[]> {
  const orderIds = await payOrders(databaseUrl, connections);
  await pays(url, orderIds.slice(-PAY_WARM_UP_ORDERS), 'warm-up', connections, 2);
  orderIds.length -= PAY_WARM_UP_ORDERS;
  return orderIds;
}

export type EmbeddedServer = Awaited<ReturnType<typeof startEmbeddedPostgres>>;

/** The sandbox provider's own PostgreSQL (so that its writes are not counted as the service's database's). */
export async function startSandboxDatabase(dir: string, socket: boolean, settings?: Record<string, string>): Promise<EmbeddedServer> {
  return startEmbeddedPostgres({ dir, port: await freePort(), socket, settings, log: (l) => process.env.BENCH_DEBUG && console.error(l) });
}

/**
 * `npm run psp`'s entry as its own process on `databaseUrl`, sending its webhooks to the service on `servicePort`
 * (chosen before the service starts: the relay's first webhook comes after the service is up). Its URL: listeningUrl.
 */
export function spawnSandbox(databaseUrl: string, servicePort: number): ChildProcess {
  return spawn(process.execPath, [fileURLToPath(new URL('../apps/psp-sandbox/src/main.js', import.meta.url))], {
    env: {
      PATH: process.env.PATH,
      PSP_PORT: '0',
      DATABASE_URL: databaseUrl,
      PSP_WEBHOOK_URL: `http://127.0.0.1:${servicePort}/webhooks/psp`,
      PSP_WEBHOOK_SECRET: WEBHOOK_SECRET,
      PSP_API_KEY: PROVIDER_KEY,
      LOG_LEVEL: 'warn',
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
}

/**
 * The service as `npm start` runs it (dist/src/main.js), with the bench's API key and provider secrets and `env` (PORT,
 * the database, the provider) over them. LOG_LEVEL left at its default (info), as `npm start` runs: what a user's
 * service pays for its logging. `nodeArgs`: e.g. --cpu-prof. Its URL: listeningUrl.
 */
export function spawnService(env: Record<string, string | undefined>, nodeArgs: string[] = []): ChildProcess {
  return spawn(process.execPath, [...nodeArgs, fileURLToPath(new URL('../src/main.js', import.meta.url))], {
    env: { PATH: process.env.PATH, API_KEYS: `bench:${SECRET}`, PSP_WEBHOOK_SECRET: WEBHOOK_SECRET, PSP_API_KEY: PROVIDER_KEY, ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
}

/** BENCH_SERVICE_ENV='NAME=value …': more variables for the measured service. */
export function benchServiceEnv(): Record<string, string> {
  return Object.fromEntries(
    (process.env.BENCH_SERVICE_ENV ?? '')
      .split(' ')
      .filter(Boolean)
      .map((pair) => [pair.split('=')[0], pair.slice(pair.indexOf('=') + 1)]),
  );
}

/** SIGTERM to a child still running; resolves once it has exited. */
export async function stopChild(child: ChildProcess | undefined): Promise<void> {
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  await exited;
}
