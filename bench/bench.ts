/**
 * npm run bench — throughput and latency of the idempotency layer, each beside what the database
 * allows for the same work (the same SQL straight through `pg`) and the framework's floor
 * (GET /health), as ratios measured in one run on one machine.
 *
 * The service runs as its own process (as in production); load comes from this process. Beside req/s
 * and latency, each row gives the CPU it cost per request, from /proc: the service process
 * (utime + stime) and this run's PostgreSQL server (its postmaster and every process below it).
 *
 * BENCH_SECONDS (8) per row; BENCH_JSON=<file> also writes the rows as JSON (bench/peer/compare.mjs
 * reads it to print the ratios against the peer). BENCH_SERVICE_ENV='NAME=value …' starts the service with
 * those variables too (e.g. DATABASE_PREPARED_STATEMENTS=false, as behind a pooler that cannot keep them).
 * BENCH_PGBOUNCER=1 puts Debian's PgBouncer in transaction mode between the service and PostgreSQL (the tests'
 * harness, test/support/pgbouncer.ts): named statements off, migrations on the direct connection.
 * The pay row calls the sandbox provider as its own process (`npm run psp`, on a PostgreSQL server of its own,
 * the service pointed at it by PSP_BASE_URL), so the sandbox's CPU and its database's are counted apart from the
 * service's; BENCH_PSP=in-process mounts it in the service instead, as measured before 2026-12-01's second half.
 * A pay row's orders are inserted, and the row warmed up for 2 s, before its CPU is sampled. BENCH_PG_STATEMENTS=1
 * prints each pay row's statements per pay from pg_stat_statements, the service's database and the sandbox's apart.
 */
import type { ChildProcess } from 'node:child_process';
import { createHash, randomUUID } from 'node:crypto';
import { mkdtemp, rm, chmod, writeFile } from 'node:fs/promises';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { DataSource } from 'typeorm';
import { freePort } from '../src/common/free-port.js';
import { startEmbeddedPostgres } from '#service-kit/embedded-postgres';
import { typeormOptions } from '../src/database/typeorm-options.js';
import { ORDER_TABLE_COLUMNS } from '../src/orders/order-columns.js';
import { type PgBouncer, startPgBouncer } from '../test/support/pgbouncer.js';
import {
  benchServiceEnv,
  BODY,
  cannon,
  CONNECTIONS,
  type CpuTargets,
  CREATE_WITH_NEW_KEYS,
  DURATION_S,
  listeningUrl,
  pays,
  percentile,
  type Row,
  SECRET,
  spawnSandbox,
  spawnService,
  startSandboxDatabase,
  stopChild,
  warmedPayOrders,
  warmUp,
  withCpu,
} from './lib.js';
import { postmasterPid } from './proc-cpu.js';
import { applyMigrations } from '#service-kit';

const STORM_WIDTH = 50;
const STORM_ROUNDS = 100;

/**
 * The service's SQL for one idempotent create, issued directly and sent as the service sends it: pipelined,
 * named statements, three round trips (BEGIN and its settings + the key's lock and look-up, SAVEPOINT + order
 * and lines, the completed key's one insert + COMMIT).
 */
async function directCreates(url: string): Promise<Row> {
  const pool = new pg.Pool({ connectionString: url, max: 20, pipeline: true });
  const begin =
    'BEGIN; SET LOCAL lock_timeout = 5000; SET LOCAL statement_timeout = 30000; SET LOCAL idle_in_transaction_session_timeout = 60000';
  const lockKey = 'SELECT pg_try_advisory_xact_lock(hashtext($1), hashtext($2)) AS locked';
  const findKey = `SELECT id, fingerprint, state, expires_at <= now() AS expired, response_status, response_headers, response_body
      FROM idempotency_keys WHERE client_id = $1 AND key = $2`;
  const insertOrder = `WITH o AS (INSERT INTO orders (client_id, order_number, currency, total_minor, shipping_address, note, creation_digest)
      VALUES ($1, $2, 'EUR', 4498, NULL, NULL, $6)
      ON CONFLICT ON CONSTRAINT uq_orders_client_order_number DO NOTHING RETURNING ${ORDER_TABLE_COLUMNS}),
      lines AS (INSERT INTO order_items (order_id, line_no, sku, quantity, unit_price_minor)
      SELECT o.id, l.line_no, l.sku, l.quantity, l.unit_price_minor FROM o, unnest($3::text[], $4::int[], $5::bigint[]) WITH ORDINALITY AS l(sku, quantity, unit_price_minor, line_no))
      SELECT ${ORDER_TABLE_COLUMNS} FROM o`;
  const recordKey = `INSERT INTO idempotency_keys (client_id, key, fingerprint, request_method, request_path, state,
      response_status, response_headers, response_body, completed_at, expires_at)
      VALUES ($1, $2, $3, 'POST', '/orders', 'completed', 201, $4, $5, now(), now() + make_interval(secs => 86400))`;
  const digest = createHash('sha256').update(BODY).digest('hex');
  const latencies: number[] = [];
  let errors = 0;
  const deadline = performance.now() + DURATION_S * 1000;
  const worker = async () => {
    while (performance.now() < deadline) {
      const started = performance.now();
      const client = await pool.connect();
      try {
        const key = randomUUID();
        const [, locked] = await Promise.all([
          client.query(begin),
          client.query<{ locked: boolean }>({ name: 'lock-key', text: lockKey, values: ['bench', key] }),
          client.query({ name: 'find-key', text: findKey, values: ['bench', key] }),
        ]);
        if (!locked.rows[0].locked) throw new Error('a new key was locked');
        await Promise.all([
          client.query('SAVEPOINT idempotent_handler'),
          client.query({
            name: 'insert-order',
            text: insertOrder,
            values: ['bench', `ord_${randomUUID()}`, ['SKU-1', 'SKU-2'], [2, 1], [1999, 500], digest],
          }),
        ]);
        await Promise.all([
          client.query({
            name: 'record-key',
            text: recordKey,
            values: ['bench', key, digest, { 'content-type': 'application/json; charset=utf-8' }, BODY],
          }),
          client.query('COMMIT'),
        ]);
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
  return {
    name: 'same SQL straight through pg',
    rps: latencies.length / DURATION_S,
    p50: percentile(latencies, 50),
    p99: percentile(latencies, 99),
    errors,
    requests: latencies.length,
  };
}

async function post(url: string, key: string, body = BODY): Promise<{ status: number; ms: number }> {
  const started = performance.now();
  const res = await fetch(`${url}/orders`, {
    method: 'POST',
    headers: { authorization: `Bearer ${SECRET}`, 'idempotency-key': key, 'content-type': 'application/json' },
    body,
  });
  await res.arrayBuffer();
  return { status: res.status, ms: performance.now() - started };
}

/** A body whose SKU names the storm round: the orders a round executed are the orders carrying its SKU. */
const stormBody = (round: number) =>
  JSON.stringify({ currency: 'EUR', items: [{ sku: `STORM-${round}`, quantity: 1, unitPriceMinor: 100 }] });

interface Rounds {
  latencies: number[];
  errors: number;
  seconds: number;
}

async function rounds(fire: (round: number) => Promise<{ status: number; ms: number }[]>): Promise<Rounds> {
  const latencies: number[] = [];
  let errors = 0;
  const started = performance.now();
  for (let round = 0; round < STORM_ROUNDS; round++) {
    for (const r of await fire(round)) {
      latencies.push(r.ms);
      if (r.status !== 201) errors++;
    }
  }
  latencies.sort((a, b) => a - b);
  return { latencies, errors, seconds: (performance.now() - started) / 1000 };
}

const roundsRow = (name: string, r: Rounds): Row => ({
  name,
  rps: r.latencies.length / r.seconds,
  p50: percentile(r.latencies, 50),
  p99: percentile(r.latencies, 99),
  errors: r.errors,
  requests: r.latencies.length,
});

/** 200 creates one after another: the latency with nothing to wait for. */
async function uncontended(url: string): Promise<Row> {
  const alone: number[] = [];
  let errors = 0;
  for (let i = 0; i < 200; i++) {
    const r = await post(url, randomUUID());
    alone.push(r.ms);
    if (r.status !== 201) errors++;
  }
  alone.sort((a, b) => a - b);
  const seconds = alone.reduce((a, b) => a + b, 0) / 1000;
  return {
    name: 'uncontended create (1 connection)',
    rps: alone.length / seconds,
    p50: percentile(alone, 50),
    p99: percentile(alone, 99),
    errors,
    requests: alone.length,
  };
}

/**
 * The storm's reference (bench/README.md): the same rounds of STORM_WIDTH simultaneous requests, each a replay of a
 * different completed key — the same CPU queueing without the wait for a duplicate in flight.
 */
async function distinctReplays(url: string, keys: string[]): Promise<Row> {
  return roundsRow(
    `${STORM_WIDTH} concurrent replays of distinct completed keys (${STORM_ROUNDS} rounds)`,
    await rounds(() => Promise.all(keys.map((key) => post(url, key)))),
  );
}

/** STORM_ROUNDS rounds of STORM_WIDTH simultaneous requests sharing one new key; then counts the orders each round created. */
async function storm(url: string, databaseUrl: string): Promise<{ row: Row; executions: number[] }> {
  const result = await rounds((round) => {
    const key = randomUUID();
    const body = stormBody(round);
    return Promise.all(Array.from({ length: STORM_WIDTH }, () => post(url, key, body)));
  });
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  try {
    const { rows } = await client.query<{ sku: string; orders: number }>(
      `SELECT sku, count(DISTINCT order_id)::int AS orders FROM order_items WHERE sku LIKE 'STORM-%' GROUP BY sku`,
    );
    const byRound = new Map(rows.map((r) => [r.sku, r.orders]));
    const executions = Array.from({ length: STORM_ROUNDS }, (_, round) => byRound.get(`STORM-${round}`) ?? 0);
    return { row: roundsRow(`${STORM_WIDTH}-way duplicate storm (${STORM_ROUNDS} rounds)`, result), executions };
  } finally {
    await client.end();
  }
}

/** Pay at c=4: the latency one payment sees when the service is not saturated (judged p99 ≤ 120 ms; c=32 is judged against its own p50). */
const PAY_LIGHT_CONNECTIONS = 4;

/**
 * BENCH_PG_STATEMENTS=1: both servers load pg_stat_statements (planning counted too), and each pay row prints, per
 * database, every statement's calls, rows, execution and planning time per pay. Off by default: it costs CPU itself.
 */
const STATEMENT_STATS =
  process.env.BENCH_PG_STATEMENTS === '1'
    ? { shared_preload_libraries: 'pg_stat_statements', 'pg_stat_statements.track_planning': 'on', 'pg_stat_statements.track': 'top' }
    : undefined;

/** Resets pg_stat_statements (`what` = 'reset'), or prints what ran since, per request of the row. */
async function statementStats(databaseUrl: string, what: string, requests = 0): Promise<void> {
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  try {
    if (what === 'reset') {
      await client.query('CREATE EXTENSION IF NOT EXISTS pg_stat_statements');
      await client.query('SELECT pg_stat_statements_reset()');
      return;
    }
    const { rows } = await client.query<Record<string, string>>(
      `SELECT calls, rows, plans, total_exec_time AS exec, total_plan_time AS plan, shared_blks_hit + shared_blks_read AS blocks,
              regexp_replace(query, '\\s+', ' ', 'g') AS query
         FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%' ORDER BY total_exec_time + total_plan_time DESC`,
    );
    const per = (x: string) => (Number(x) / requests).toFixed(3);
    const sum = (k: string) => rows.reduce((a, r) => a + Number(r[k]), 0);
    console.log(`\n${what}: ${requests} requests; per request: exec ${per(String(sum('exec')))} ms, plan ${per(String(sum('plan')))} ms`);
    console.log(
      '| calls/req | rows/req | plans/req | exec ms/req | mean exec ms | plan ms/req | blocks/call | statement |\n|---:|---:|---:|---:|---:|---:|---:|---|',
    );
    for (const r of rows.slice(0, 40)) {
      const mean = (Number(r.exec) / Number(r.calls)).toFixed(3);
      const blocks = (Number(r.blocks) / Number(r.calls)).toFixed(1);
      console.log(
        `| ${per(r.calls)} | ${per(r.rows)} | ${per(r.plans)} | ${per(r.exec)} | ${mean} | ${per(r.plan)} | ${blocks} | ${r.query.slice(0, 200)} |`,
      );
    }
  } finally {
    await client.end();
  }
}

/** Prints the rows as a Markdown table; returns the load line recorded with them. */
function printRows(rows: Row[], loadAtStart: number, throughPooler: boolean): string {
  const ms = (x: number | undefined) => (x === undefined || Number.isNaN(x) ? '–' : x.toFixed(2));
  const load = `load average ${loadAtStart.toFixed(1)} at the start, ${loadavg()[0].toFixed(1)} at the end, on ${cpus().length} cores`;
  const path = [
    throughPooler ? 'through PgBouncer (transaction mode)' : '',
    process.env.BENCH_SERVICE_ENV ? `service with ${process.env.BENCH_SERVICE_ENV}` : '',
  ]
    .filter(Boolean)
    .join(', ');
  console.log(
    `\n${CONNECTIONS} connections, ${DURATION_S} s each (storm: ${STORM_WIDTH} at once, ${STORM_ROUNDS} rounds)${path ? `; ${path}` : ''}; ${load}\n`,
  );
  console.log(
    '| workload | req/s | p50 ms | p99 ms | errors | service CPU ms/req | PostgreSQL CPU ms/req |\n|---|---:|---:|---:|---:|---:|---:|',
  );
  for (const r of rows) {
    console.log(
      `| ${r.name} | ${r.rps.toFixed(0)} | ${r.p50.toFixed(1)} | ${r.p99.toFixed(1)} | ${r.errors} | ${ms(r.serviceCpuMs)} | ${ms(r.pgCpuMs)} |`,
    );
  }
  console.log(
    '(CPU from /proc: utime+stime of the service process; of this run\'s postmaster and all its children. "–": no service in the path.)',
  );
  for (const r of rows.filter((x) => x.sandboxCpuMs !== undefined)) {
    console.log(
      `${r.name}: the sandbox's own process ${ms(r.sandboxCpuMs)} ms and its PostgreSQL ${ms(r.sandboxPgCpuMs)} ms of CPU per pay, apart from the columns above`,
    );
  }
  return load;
}

async function main(): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-bench-'));
  await chmod(dir, 0o755);
  console.error('starting PostgreSQL');
  const pgDir = join(dir, 'pg');
  // A port the OS says is free now, not a random guess: back-to-back runs (BENCH_ROUNDS) start many servers.
  // Over the Unix socket, as `npm start` and the peer's runs are; BENCH_SOCKET=0 measures loopback TCP instead.
  const viaSocket = process.env.BENCH_SOCKET !== '0';
  const server = await startEmbeddedPostgres({
    dir: pgDir,
    port: await freePort(),
    socket: viaSocket,
    settings: STATEMENT_STATS,
    log: (l) => process.env.BENCH_DEBUG && console.error(l),
  });
  const dbUrl = server.socketUrl ?? server.url;
  let service: ChildProcess | undefined;
  let sandbox: ChildProcess | undefined;
  let sandboxServer: Awaited<ReturnType<typeof startEmbeddedPostgres>> | undefined;
  let pooler: PgBouncer | undefined;
  // Ctrl-C or a kill skips `finally`: stop what this run started, then exit.
  let stopping = false;
  const onSignal = () => {
    if (stopping) return; // a Ctrl-C can arrive twice (from the terminal and from bench:compare)
    stopping = true;
    service?.kill('SIGKILL');
    sandbox?.kill('SIGKILL');
    void Promise.allSettled([pooler?.stop(), server.stop(), sandboxServer?.stop()]).finally(() => process.exit(130));
  };
  process.on('SIGINT', onSignal).on('SIGTERM', onSignal);
  try {
    // Two connections: applyMigrations holds one for its advisory lock while TypeORM migrates on another.
    const setup = new DataSource(typeormOptions(dbUrl, { lockTimeoutMs: 10_000, poolSize: 2 }));
    await setup.initialize();
    await applyMigrations(setup);
    console.error('migrated; starting the service');
    await setup.destroy();

    if (process.env.BENCH_PGBOUNCER === '1') pooler = await startPgBouncer(server.url, await freePort());
    const through = pooler
      ? { DATABASE_URL: pooler.pooledUrl(server.url), DATABASE_PREPARED_STATEMENTS: 'false', DATABASE_MIGRATION_URL: server.url }
      : { DATABASE_URL: dbUrl };
    const servicePort = await freePort();
    let provider: Record<string, string> = { PSP_SANDBOX: 'in-process' };
    const sandboxApart = process.env.BENCH_PSP !== 'in-process';
    if (sandboxApart) {
      console.error('starting the sandbox provider (its own process and PostgreSQL)');
      sandboxServer = await startSandboxDatabase(join(dir, 'psp-pg'), viaSocket, STATEMENT_STATS);
      sandbox = spawnSandbox(sandboxServer.socketUrl ?? sandboxServer.url, servicePort);
      provider = { PSP_BASE_URL: `${await listeningUrl(sandbox)}/psp` };
    }
    // BENCH_SERVICE_ARGS='--cpu-prof' profiles the service while it is measured.
    const nodeArgs = process.env.BENCH_SERVICE_ARGS?.split(' ').filter(Boolean) ?? [];
    service = spawnService({ PORT: String(servicePort), ...through, ...provider, ...benchServiceEnv() }, nodeArgs);
    const url = await listeningUrl(service);
    const headers = { authorization: `Bearer ${SECRET}`, 'content-type': 'application/json' };

    console.error(`service at ${url}; measuring`);
    // On a shared machine the other sessions' load is part of every number: printed and recorded beside them.
    const loadAtStart = loadavg()[0];
    const cpu: CpuTargets = { servicePid: service.pid, postmaster: postmasterPid(pgDir) };
    const payCpu: CpuTargets =
      sandbox && sandboxServer ? { ...cpu, sandbox: { pid: sandbox.pid!, postmaster: postmasterPid(join(dir, 'psp-pg')) } } : cpu;
    const measured = (workload: () => Promise<Row>) => withCpu(cpu, workload);
    await warmUp(url);

    const rows: Row[] = [];
    const tolerate = async (name: string, workload: () => Promise<Row>, targets = cpu) => {
      try {
        rows.push(await withCpu(targets, workload));
      } catch (err) {
        // One broken workload (pay, before a provider client is wired) must not hide the others.
        console.error(`${name} failed:`, err);
        rows.push({ name, rps: NaN, p50: NaN, p99: NaN, errors: NaN, requests: 0 });
      }
    };
    const sandboxWhere = `sandbox ${sandboxApart ? 'in its own process' : 'in-process'}`;
    const payName = `pay with tok_visa (new key and order each; ${sandboxWhere})`;
    const payLightName = `pay with tok_visa at ${PAY_LIGHT_CONNECTIONS} connections (new key and order each; ${sandboxWhere})`;
    const sandboxDbUrl = sandboxServer && (sandboxServer.socketUrl ?? sandboxServer.url);
    const payRow = async (name: string, connections: number) => {
      const orderIds = await warmedPayOrders(url, dbUrl, connections);
      const statsOf = [['the service', dbUrl], ...(sandboxDbUrl ? [['the sandbox', sandboxDbUrl]] : [])];
      if (STATEMENT_STATS) for (const [, db] of statsOf) await statementStats(db, 'reset');
      await tolerate(name, () => pays(url, orderIds, name, connections), payCpu);
      const requests = rows.at(-1)!.requests;
      if (STATEMENT_STATS) for (const [whose, db] of statsOf) await statementStats(db, `${name}, ${whose}'s PostgreSQL`, requests);
    };
    const payHeavy = () => payRow(payName, CONNECTIONS);
    const payLight = () => payRow(payLightName, PAY_LIGHT_CONNECTIONS);
    // BENCH_ONLY=pay, pay4 or create: that row alone (e.g. to profile it with BENCH_SERVICE_ARGS='--cpu-prof').
    if (process.env.BENCH_ONLY === 'pay' || process.env.BENCH_ONLY === 'pay4') {
      if (process.env.BENCH_ONLY === 'pay') await payHeavy();
      else await payLight();
      printRows(rows, loadAtStart, pooler !== undefined);
      return;
    }
    if (process.env.BENCH_ONLY === 'create') {
      rows.push(await measured(() => cannon('idempotent create (new key each)', `${url}/orders`, CREATE_WITH_NEW_KEYS)));
      printRows(rows, loadAtStart, pooler !== undefined);
      return;
    }
    rows.push(await measured(() => cannon('GET /health', `${url}/health`, {})));
    rows.push(await measured(() => cannon('idempotent create (new key each)', `${url}/orders`, CREATE_WITH_NEW_KEYS)));
    rows.push(await withCpu({ postmaster: cpu.postmaster }, () => directCreates(dbUrl)));
    const replayKeys = Array.from({ length: 100 }, () => randomUUID());
    for (const key of replayKeys) await post(url, key);
    let next = 0;
    rows.push(
      await measured(() =>
        cannon('replay of a completed key', `${url}/orders`, {
          method: 'POST',
          headers,
          body: BODY,
          requests: [
            { setupRequest: (req) => ({ ...req, headers: { ...req.headers, 'idempotency-key': replayKeys[next++ % replayKeys.length] } }) },
          ],
        }),
      ),
    );
    const orderIds = await Promise.all(
      replayKeys.slice(0, 10).map(async (key) => {
        const res = await fetch(`${url}/orders`, { method: 'POST', headers: { ...headers, 'idempotency-key': key }, body: BODY });
        return ((await res.json()) as { id: string }).id;
      }),
    );
    let nextOrder = 0;
    rows.push(
      await measured(() =>
        cannon('GET /orders/:id', `${url}/orders`, {
          headers,
          requests: [{ setupRequest: (req) => ({ ...req, method: 'GET', path: `/orders/${orderIds[nextOrder++ % orderIds.length]}` }) }],
        }),
      ),
    );
    rows.push(await measured(() => uncontended(url)));
    const distinctKeys = Array.from({ length: STORM_WIDTH }, () => randomUUID());
    const seeded = await Promise.all(distinctKeys.map((key) => post(url, key)));
    if (seeded.some((r) => r.status !== 201)) throw new Error(`seeding the replay keys failed: ${seeded.map((r) => r.status).join(',')}`);
    const reference = await measured(() => distinctReplays(url, distinctKeys));
    let executions: number[] = [];
    const stormRow = await measured(async () => {
      const result = await storm(url, dbUrl);
      executions = result.executions;
      return result.row;
    });
    rows.push(reference, stormRow);
    await payHeavy();
    await payLight();

    const byName = (n: string) => rows.find((r) => r.name.startsWith(n))!;
    const load = printRows(rows, loadAtStart, pooler !== undefined);
    const oneEach = executions.filter((n) => n === 1).length;
    const stormRatio = stormRow.p99 / reference.p99;
    console.log(`\ncreate / same SQL through pg: ${(byName('idempotent create').rps / byName('same SQL').rps).toFixed(2)}×`);
    console.log(`replay / GET /health:         ${(byName('replay').rps / byName('GET /health').rps).toFixed(2)}×`);
    console.log(
      `storm p99 / p99 of ${STORM_WIDTH} concurrent distinct replays: ${stormRatio.toFixed(2)}× (target ≤ 3×: ${stormRatio <= 3 ? 'met' : 'not met'})`,
    );
    console.log(
      `storm executions per round: ${oneEach}/${STORM_ROUNDS} rounds created exactly one order (min ${Math.min(...executions)}, max ${Math.max(...executions)}); storm errors: ${stormRow.errors}`,
    );
    if (process.env.BENCH_JSON) {
      const report = {
        date: new Date().toISOString(),
        machine: `${cpus().length} × ${cpus()[0]?.model ?? 'unknown CPU'}, node ${process.version}`,
        connections: CONNECTIONS,
        seconds: DURATION_S,
        stormWidth: STORM_WIDTH,
        stormRounds: STORM_ROUNDS,
        rows,
        stormExecutions: executions,
        load,
      };
      await writeFile(process.env.BENCH_JSON, JSON.stringify(report, null, 2));
    }
  } finally {
    for (const child of [service, sandbox]) await stopChild(child);
    await sandboxServer?.stop();
    await pooler?.stop();
    await server.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
