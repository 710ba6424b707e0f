/**
 * npm run conformance:peer — the kit's CLI (conformance/dist/cli.js, its own package) against four targets, each with
 * every check: the registry peer in bench/peer (`@node-idempotency/nestjs`, memory store), this service, and the kit's
 * two targets (conformance/targets/orders-target.ts: key-after-commit, route-key). Each target fails exactly the
 * checks of its known faults (below, with the reason in its code) and nothing else, or the run fails: the kit is
 * shown able to fail, and not failing what passes. Then the verdict table in docs/conformance.md must be the one
 * these expectations produce (`-- --write` rewrites it). Stops and removes everything it started.
 *   node dist/conformance/peer/check-peer.js [--ports PEER,SERVICE,KEY_AFTER_COMMIT,ROUTE_KEY] [--pg-port N] [--write]
 */
import { execFile } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { freePort } from '../../src/common/free-port.js';
import { startEmbeddedPostgres } from '#service-kit/embedded-postgres';
import type { Outcome } from '../checks.js';
import type { KitConfig } from '../config.js';
import type { KitReport } from '../kit.js';
import { FAILING_TOTAL } from './failing-total.js';

const here = dirname(fileURLToPath(import.meta.url));
/** The checkout: this file runs from dist/conformance/peer/. */
const root = resolve(here, '../../..');
const script = (name: string) => join(here, `${name}.js`);
const KIT_CLI = join(root, 'conformance/dist/cli.js');
const DOCS = join(root, 'docs/conformance.md');
const TABLE_START = '<!-- verdicts: written by `npm run conformance:table`; CI fails when they differ -->';
const TABLE_END = '<!-- end of verdicts -->';

/** What a target is expected to get from a check other than a pass, and why, in its code. */
interface Expected {
  outcome: Outcome | 'pass or fail' | 'pass or n/a';
  reason: string;
}

const TARGETS = ['peer', 'service', 'key-after-commit', 'route-key'] as const;
type TargetName = (typeof TARGETS)[number];

const TITLES: Record<TargetName, string> = {
  peer: '`@node-idempotency/nestjs` 1.0.4, memory store (bench/peer)',
  service: 'this service',
  'key-after-commit': 'kit target: key recorded after the commit',
  'route-key': 'kit target: key by method + path + key',
};

const TARGET_FILE = 'conformance/targets/orders-target.ts';
const NO_HOLD = { outcome: 'n/a', reason: 'no way to hold a request after its effect in the peer' } as const;

const EXPECTED: Record<TargetName, Record<string, Expected>> = {
  peer: {
    'conflict-retry-after': {
      outcome: 'pass or n/a',
      reason: 'without a hold its duplicates overlap by chance: a 409 with Retry-After, or none to judge',
    },
    'malformed-key-too-long': {
      outcome: 'choice',
      reason: 'its limit is 256 characters (`IDEMPOTENCY_KEY_LEN` in @node-idempotency/core), not 255; keys are kept whole',
    },
    'malformed-key-commas': { outcome: 'fail', reason: 'a bare key with commas is accepted (two merged headers taken as one key)' },
    'malformed-key-two-headers': { outcome: 'fail', reason: 'two Idempotency-Key headers are accepted (as one merged value)' },
    'other-caller-own-effect': {
      outcome: 'fail',
      reason: "client B sending A's key gets A's order: its store is keyed by method + URL + key only",
    },
    'reordered-json-replays': { outcome: 'fail', reason: 'the same JSON with members reordered is a 422: it fingerprints the raw bytes' },
    'validation-error-keeps-key': {
      outcome: 'choice',
      reason: 'it stores the 400 and replays it to the same request: a fixed request needs a new key',
    },
    'server-error-not-stored': { outcome: 'fail', reason: 'a 500 is stored and replayed to every retry of the key' },
    'openapi-expiry': { outcome: 'n/a', reason: 'the peer app publishes no OpenAPI document' },
    'crash-after-effect': NO_HOLD,
    'crash-one-effect': {
      outcome: 'fail',
      reason: 'killed and restarted, keys answered before the kill execute again: the memory store is lost',
    },
  },
  service: {
    'conflict-retry-after': { outcome: 'n/a', reason: 'a duplicate waits on the key and gets the replay: no 409 to judge' },
  },
  'key-after-commit': {
    'crash-after-effect': {
      outcome: 'fail',
      reason: `the order commits in the handler's transaction and the answer is recorded after it (\`keyAfterCommit()\` in ${TARGET_FILE}): killed between the two, its claim lapses and the retry orders again`,
    },
    'crash-one-effect': {
      outcome: 'fail',
      reason: 'the same fault: its held keys are killed between the commit and the record every run, and their retries order again',
    },
  },
  'route-key': {
    'conflict-retry-after': { outcome: 'n/a', reason: "a duplicate waits on the key's lock and gets the replay: no 409 to judge" },
    'other-caller-own-effect': {
      outcome: 'fail',
      reason: `the key's scope is method + path, not the caller (\`scope\` in \`create()\`, ${TARGET_FILE}): B gets A's order`,
    },
  },
};

const log = (message: string) => console.error(`[${new Date().toISOString().slice(11, 19)}] ${message}`);
const stoppers: (() => Promise<void> | void)[] = [];
async function stopAll(): Promise<void> {
  for (let stop = stoppers.pop(); stop; stop = stoppers.pop()) {
    try {
      await stop();
    } catch (err) {
      log(`cleanup: ${(err as Error).message}`);
    }
  }
}
for (const signal of ['SIGINT', 'SIGTERM'] as const) process.once(signal, () => void stopAll().finally(() => process.exit(130)));

function options(argv: string[]): { ports: number[]; pgPort?: number; write: boolean } {
  const out: { ports: number[]; pgPort?: number; write: boolean } = { ports: [], write: false };
  for (let i = 0; i < argv.length; i++) {
    const port = (text: string | undefined) => {
      if (!text || !/^\d+$/.test(text) || Number(text) < 1 || Number(text) > 65535)
        throw new Error(`${argv[i]} takes port numbers, got ${text}`);
      return Number(text);
    };
    if (argv[i] === '--write') out.write = true;
    else if (argv[i] === '--ports') out.ports = (argv[++i] ?? '').split(',').map(port);
    else if (argv[i] === '--pg-port') out.pgPort = port(argv[++i]);
    else throw new Error(`unknown argument ${argv[i]}: --ports ${TARGETS.join(',')} (HTTP ports, in this order), --pg-port N, --write`);
  }
  if (out.ports.length !== 0 && out.ports.length !== TARGETS.length)
    throw new Error(`--ports takes ${TARGETS.length} ports: ${TARGETS.join(',')}`);
  return out;
}

const dir = mkdtempSync(join(tmpdir(), 'idempotent-orders-conformance-'));
// PostgreSQL runs as another user when we are root: it must be able to enter the folder.
chmodSync(dir, 0o755);
stoppers.push(() => rmSync(dir, { recursive: true, force: true }));
const quote = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;
const nodeCommand = (file: string, ...args: string[]) => [process.execPath, file, ...args].map(quote).join(' ');

function run(file: string, args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolveRun, reject) =>
    execFile(file, args, { maxBuffer: 16 * 1024 * 1024 }, (err, stdout, stderr) => {
      if (err && typeof err.code !== 'number') reject(new Error(`${file} did not run: ${err.message}`, { cause: err }));
      else resolveRun({ code: err ? Number(err.code) : 0, stdout, stderr });
    }),
  );
}

/** One embedded PostgreSQL, a database per target. */
async function startPostgres(port: number | undefined): Promise<(name: string) => Promise<string>> {
  const server = await startEmbeddedPostgres({ dir: join(dir, 'pg'), port: port ?? (await freePort()), fast: true });
  stoppers.push(() => server.stop());
  return async (name) => {
    const admin = new pg.Client({ connectionString: server.url });
    await admin.connect();
    try {
      await admin.query(`CREATE DATABASE ${name.replaceAll('-', '_')}`);
    } finally {
      await admin.end();
    }
    return server.url.replace(/\/postgres$/, `/${name.replaceAll('-', '_')}`);
  };
}

/** Starts an app with the command the crash checks will use to restart it, and kills it (by its pid) at the end. */
async function startApp(name: string, port: number, entry: string, env: Record<string, string>, readyPath: string) {
  const [envFile, pidFile, logFile] = ['env.json', 'pid', 'log'].map((ext) => join(dir, `${name}.${ext}`));
  writeFileSync(envFile, JSON.stringify({ ...env, PORT: String(port) }));
  const base = `http://127.0.0.1:${port}`;
  const start = nodeCommand(script('start-detached'), entry, envFile, pidFile, `${base}${readyPath}`, logFile);
  stoppers.push(() => {
    try {
      process.kill(Number(readFileSync(pidFile, 'utf8')), 'SIGKILL');
    } catch {
      // Already gone, or never started.
    }
  });
  const started = await run('sh', ['-c', start]);
  if (started.code !== 0) throw new Error(`${name} did not start:\n${started.stderr}\n${readFileSync(logFile, 'utf8')}`);
  return { base, start, kill: `kill -9 $(cat ${quote(pidFile)})` };
}

/** The kit's CLI on a config file; its JSON report (exit 1 is a failed check, anything else a broken run). */
async function kit(name: string, config: KitConfig): Promise<KitReport> {
  const file = join(dir, `${name}.conformance.json`);
  writeFileSync(file, JSON.stringify(config, null, 2));
  log(`the kit against ${name}: node conformance/dist/cli.js --config ${file} --json`);
  const { code, stdout, stderr } = await run(process.execPath, [KIT_CLI, '--config', file, '--json']);
  // 2 is a broken run (the harness's config is wrong), never a verdict; 3 (inconclusive) is judged per check below.
  if (code !== 0 && code !== 1 && code !== 3) throw new Error(`the kit could not run against ${name} (exit ${code}):\n${stderr}${stdout}`);
  const report = JSON.parse(stdout) as KitReport;
  if ((code === 1) !== report.summary.fail > 0 || (code === 3) !== (report.summary.fail === 0 && report.summary.inconclusive > 0))
    throw new Error(`the kit exited ${code} with ${report.summary.fail} failed check(s)`);
  log(
    `${name}: ${report.summary.pass} passed, ${report.summary.fail} failed, ${report.summary.choice} choice(s), ${report.summary['n/a']} not applicable`,
  );
  return report;
}

const body = { currency: 'EUR', items: [{ sku: 'sku-{{unique}}', quantity: 2, unitPriceMinor: 1500 }] };
const serverError = (databaseUrl: string) => ({
  body: { currency: 'EUR', items: [{ sku: 'sku-5xx', quantity: 1, unitPriceMinor: FAILING_TOTAL }] },
  arm: nodeCommand(script('fail-inserts'), 'arm', databaseUrl),
  disarm: nodeCommand(script('fail-inserts'), 'disarm', databaseUrl),
});
const hold = { headers: { 'Conformance-Hold': '3000' } };

async function runTarget(name: TargetName, port: number, database: (name: string) => Promise<string>): Promise<KitReport> {
  const url = await database(name);
  const common = { operation: { method: 'POST', path: '/orders', body }, serverError: serverError(url) };
  if (name === 'peer') {
    // The peer's guard takes the bearer token as the client id; it lists nothing, so effects are counted in its database.
    const app = await startApp(
      name,
      port,
      join(root, 'bench/peer/app/dist/main.js'),
      { DATABASE_URL: url, STORAGE: 'memory', POOL_MAX: '10' },
      '/ping',
    );
    return kit(name, {
      ...common,
      base: app.base,
      callers: { a: { Authorization: 'Bearer conformance-a' }, b: { Authorization: 'Bearer conformance-b' } },
      effects: { command: `${nodeCommand(script('count-orders'), url)} conformance-{caller}`, id: 'body:id' },
      crash: { kill: app.kill, start: app.start },
    });
  }
  if (name === 'service') {
    const secret = (who: string) => `conformance-${who}-secret-0123456789`;
    const app = await startApp(
      name,
      port,
      join(root, 'dist/src/main.js'),
      {
        DATABASE_URL: url,
        LOG_LEVEL: 'warn',
        API_KEYS: `conformance-a:${secret('a')},conformance-b:${secret('b')}`,
        PSP_WEBHOOK_SECRET: `whsec_${Buffer.from('conformance-webhook-secret-0123456789').toString('base64')}`,
        PSP_API_KEY: secret('provider'),
        // On a real database the in-process sandbox provider must be asked for (the kit never pays).
        PSP_SANDBOX: 'in-process',
        CONFORMANCE_HOOKS: '1',
      },
      '/health',
    );
    return kit(name, {
      ...common,
      base: app.base,
      callers: { a: { Authorization: `Bearer ${secret('a')}` }, b: { Authorization: `Bearer ${secret('b')}` } },
      effects: { list: { path: '/orders?limit=100', items: 'items', next: 'nextCursor', cursorParam: 'cursor' } },
      openapi: '/docs-json',
      hold,
      crash: { kill: app.kill, start: app.start },
    });
  }
  const app = await startApp(
    name,
    port,
    join(root, 'dist/conformance/targets/orders-target.js'),
    { DATABASE_URL: url, TARGET_DESIGN: name, CONFORMANCE_HOOKS: '1' },
    '/ping',
  );
  return kit(name, {
    ...common,
    base: app.base,
    callers: { a: { Authorization: 'Bearer conformance-a' }, b: { Authorization: 'Bearer conformance-b' } },
    effects: { list: { path: '/orders', items: 'items' } },
    openapi: '/docs-json',
    hold,
    crash: { kill: app.kill, start: app.start },
  });
}

/** The table as the expectations say it: stable from run to run (no keys, counts or timings in it). */
function table(checks: { id: string; title: string }[]): string {
  const cell = (name: TargetName, id: string) => {
    const e = EXPECTED[name][id];
    if (!e) return 'pass';
    const label =
      e.outcome === 'fail'
        ? '**fail**'
        : e.outcome === 'pass or fail'
          ? 'pass, or **fail** by chance'
          : e.outcome === 'pass or n/a'
            ? 'pass, or n/a by chance'
            : e.outcome;
    return `${label}: ${e.reason.replaceAll('|', '\\|')}`;
  };
  return [
    `| check | ${TARGETS.map((t) => TITLES[t]).join(' | ')} |`,
    `|---|${TARGETS.map(() => '---').join('|')}|`,
    ...checks.map((c) => `| \`${c.id}\` | ${TARGETS.map((t) => cell(t, c.id)).join(' | ')} |`),
  ].join('\n');
}

async function main(): Promise<number> {
  const { ports, pgPort, write } = options(process.argv.slice(2));
  const database = await startPostgres(pgPort);
  const reports = new Map<TargetName, KitReport>();
  // One at a time: the crash checks kill and restart, and the machine may be shared.
  for (const [i, name] of TARGETS.entries()) reports.set(name, await runTarget(name, ports[i] ?? (await freePort()), database));

  const problems: string[] = [];
  for (const [name, report] of reports) {
    for (const r of report.results) {
      const e = EXPECTED[name][r.id] ?? { outcome: 'pass', reason: '' };
      const fits =
        e.outcome === 'pass or fail'
          ? r.outcome === 'pass' || r.outcome === 'fail'
          : e.outcome === 'pass or n/a'
            ? r.outcome === 'pass' || r.outcome === 'n/a'
            : r.outcome === e.outcome;
      if (!fits) problems.push(`${name}: ${r.id} is ${r.outcome}, expected ${e.outcome}${e.reason ? ` (${e.reason})` : ''}: ${r.detail}`);
      else if (r.outcome !== 'pass') log(`${name}: ${r.id} ${r.outcome} as expected: ${r.detail}`);
    }
  }
  const text = table(reports.get('service')!.results);
  console.log(text);
  const docs = readFileSync(DOCS, 'utf8');
  const [start, end] = [docs.indexOf(TABLE_START), docs.indexOf(TABLE_END)];
  if (start < 0 || end < start) problems.push(`docs/conformance.md has no verdict table between ${TABLE_START} and ${TABLE_END}`);
  else {
    const updated = `${docs.slice(0, start + TABLE_START.length)}\n${text}\n${docs.slice(end)}`;
    if (write) writeFileSync(DOCS, updated);
    else if (updated !== docs)
      problems.push("the verdict table in docs/conformance.md differs from this run's: npm run conformance:table rewrites it");
  }
  for (const p of problems) console.error(`conformance:peer: ${p}`);
  if (problems.length === 0)
    log(`every target fails exactly the checks of its known faults; the service passes all ${reports.get('service')!.results.length}`);
  return problems.length === 0 ? 0 : 1;
}

void main()
  .then(
    (code) => (process.exitCode = code),
    (err: unknown) => {
      console.error(err);
      process.exitCode = 1;
    },
  )
  // Explicitly: embedded-postgres's exit hook (async-exit-hook) turns beforeExit into process.exit(0), which would
  // drop the exit code and let CI pass a failed run.
  .finally(() => stopAll().finally(() => process.exit(process.exitCode ?? 1)));
