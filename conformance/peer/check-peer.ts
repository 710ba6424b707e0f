/**
 * npm run conformance:peer — the kit's CLI (--json) against the peer app in bench/peer and against the service, each
 * on its own embedded PostgreSQL, with every check (the 5xx and crash ones too). Prints the two side by side (the
 * README's table), and fails unless the peer fails exactly the checks of its known faults and the service fails
 * none: the kit is shown able to fail, and not failing what passes. Stops and removes everything it started.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync, chmodSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { freePort } from '../../src/common/free-port.js';
import { startEmbeddedPostgres } from '../../src/database/embedded-postgres.js';
import type { CheckResult } from '../checks.js';
import type { KitConfig } from '../config.js';
import type { KitReport } from '../kit.js';
import { FAILING_TOTAL } from './failing-total.js';

const here = dirname(fileURLToPath(import.meta.url));
/** The checkout: this file runs from dist/conformance/peer/. */
const root = resolve(here, '../../..');
const script = (name: string) => join(here, `${name}.js`);

/** The peer's faults, each the check that finds it (docs/conformance.md). Anything else failing, or one of these passing, fails the run. */
const PEER_FAULTS: Record<string, string> = {
  'missing-key': 'its 400 is Nest JSON, not application/problem+json',
  'malformed-key-too-long': 'a 256-character key is accepted',
  'malformed-key-commas': 'a bare key with commas is accepted',
  'malformed-key-two-headers': 'two Idempotency-Key headers are accepted (as one merged value)',
  'other-caller-own-effect': "client B sending A's key gets A's order (the store is keyed by method + URL + key only)",
  'reordered-json-replays': 'the same JSON with members reordered is a 422',
  'validation-error-keeps-key': 'a 400 is stored: the corrected request under the same key is a 422',
  'server-error-not-stored': 'a 500 is stored and replayed to every retry of the key',
  'crash-one-effect': 'killed and restarted, keys answered before the kill execute again (memory store)',
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

async function startPostgres(name: string): Promise<string> {
  const server = await startEmbeddedPostgres({ dir: join(dir, `pg-${name}`), port: await freePort(), fast: true });
  stoppers.push(() => server.stop());
  return server.url;
}

/** Starts an app with the command the crash check will use to restart it, and kills it (by its pid) at the end. */
async function startApp(name: string, entry: string, env: Record<string, string>, readyPath: string) {
  const port = await freePort();
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
  log(`the kit against ${name}: node dist/conformance/cli.js --config ${file} --json`);
  const { code, stdout, stderr } = await run(process.execPath, [join(root, 'dist/conformance/cli.js'), '--config', file, '--json']);
  if (code !== 0 && code !== 1) throw new Error(`the kit could not run against ${name} (exit ${code}):\n${stderr}`);
  const report = JSON.parse(stdout) as KitReport;
  if (code === 1 !== report.summary.fail > 0) throw new Error(`the kit exited ${code} with ${report.summary.fail} failed check(s)`);
  log(`${name}: ${report.summary.pass} passed, ${report.summary.fail} failed, ${report.summary['n/a']} not applicable`);
  return report;
}

const body = { currency: 'EUR', items: [{ sku: 'sku-{{unique}}', quantity: 2, unitPriceMinor: 1500 }] };
const serverError = (databaseUrl: string) => ({
  body: { currency: 'EUR', items: [{ sku: 'sku-5xx', quantity: 1, unitPriceMinor: FAILING_TOTAL }] },
  arm: nodeCommand(script('fail-inserts'), 'arm', databaseUrl),
  disarm: nodeCommand(script('fail-inserts'), 'disarm', databaseUrl),
});

async function main(): Promise<number> {
  const [peerDb, oursDb] = await Promise.all([startPostgres('peer'), startPostgres('service')]);

  // The peer's guard takes the bearer token as the client id; it lists nothing, so effects are counted in its database.
  const peer = await startApp('peer', join(root, 'bench/peer/app/dist/main.js'), { DATABASE_URL: peerDb, STORAGE: 'memory', POOL_MAX: '10' }, '/ping');
  const peerReport = await kit('peer', {
    base: peer.base,
    operation: { method: 'POST', path: '/orders', body },
    callers: { a: { Authorization: 'Bearer conformance-a' }, b: { Authorization: 'Bearer conformance-b' } },
    effects: { command: `${nodeCommand(script('count-orders'), peerDb)} conformance-{caller}`, id: 'body:id' },
    serverError: serverError(peerDb),
    crash: { kill: peer.kill, start: peer.start },
  });

  const secret = (who: string) => `conformance-${who}-secret-0123456789`;
  const ours = await startApp(
    'service',
    join(root, 'dist/src/main.js'),
    {
      DATABASE_URL: oursDb,
      LOG_LEVEL: 'warn',
      API_KEYS: `conformance-a:${secret('a')},conformance-b:${secret('b')}`,
      PSP_WEBHOOK_SECRET: `whsec_${Buffer.from('conformance-webhook-secret-0123456789').toString('base64')}`,
      // On a real database the in-process sandbox provider must be asked for (the kit never pays).
      PSP_SANDBOX: 'in-process',
    },
    '/health',
  );
  const oursReport = await kit('service', {
    base: ours.base,
    operation: { method: 'POST', path: '/orders', body },
    callers: { a: { Authorization: `Bearer ${secret('a')}` }, b: { Authorization: `Bearer ${secret('b')}` } },
    effects: { list: { path: '/orders?limit=100', items: 'items', next: 'nextCursor', cursorParam: 'cursor' } },
    openapi: '/docs-json',
    serverError: serverError(oursDb),
    crash: { kill: ours.kill, start: ours.start },
  });

  const cell = (r: CheckResult | undefined) => (!r ? 'not run' : r.outcome === 'pass' ? 'pass' : `**${r.outcome}**: ${r.detail.replaceAll('|', '\\|')}`);
  console.log('| check | the peer (`@node-idempotency/nestjs`, memory store) | this service |\n|---|---|---|');
  for (const p of peerReport.results) console.log(`| \`${p.id}\` | ${cell(p)} | ${cell(oursReport.results.find((r) => r.id === p.id))} |`);

  const problems: string[] = [];
  const peerFailed = new Map(peerReport.results.filter((r) => r.outcome === 'fail').map((r) => [r.id, r.detail]));
  for (const [id, fault] of Object.entries(PEER_FAULTS)) if (!peerFailed.has(id)) problems.push(`the kit did not find the peer's fault "${fault}" (${id})`);
  for (const [id, detail] of peerFailed) if (!(id in PEER_FAULTS)) problems.push(`the kit fails the peer on ${id}, not one of its known faults: ${detail}`);
  for (const r of oursReport.results) if (r.outcome !== 'pass') problems.push(`the service: ${r.id} is ${r.outcome}: ${r.detail}`);
  for (const p of problems) console.error(`conformance:peer: ${p}`);
  if (problems.length === 0) log(`the peer fails the ${peerFailed.size} checks of its known faults; the service passes all ${oursReport.results.length}`);
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
  .finally(() => stopAll());
