// Process plumbing shared by run.mjs (bench), probes.mjs and compare.mjs: embedded PostgreSQL (the service's
// own libs/service-kit/src/embedded-postgres.ts, from the root build in dist/), redis-server when installed, the peer
// app, our service. Every process started here is tracked and stopped by stopAll() (finally, or on a signal).
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const here = path.dirname(fileURLToPath(import.meta.url));
export const root = path.resolve(here, '../..');
const dist = (p) => path.join(root, 'dist', p);

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
export const log = (m) => console.error(`[${new Date().toISOString().slice(11, 19)}] ${m}`);
export const arg = (n, d) => {
  const i = process.argv.indexOf(`--${n}`);
  return i > 0 ? process.argv[i + 1] : d;
};

/** The service's own (src/common/free-port.ts, from the root build). */
export async function freePort() {
  const { freePort: free } = await import(dist('src/common/free-port.js'));
  return free();
}

// ---- cleanup: children (by pid, their own process group) and async stoppers (PostgreSQL), newest first
const stoppers = [];
export function onStop(fn) {
  stoppers.push(fn);
  return fn;
}
export async function stopAll() {
  while (stoppers.length) {
    const fn = stoppers.pop();
    try {
      await fn();
    } catch (e) {
      log(`cleanup: ${e.message}`);
    }
  }
}
let signalled = false;
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => {
    if (signalled) return;
    signalled = true;
    log(`${sig}: stopping what this run started`);
    void stopAll().finally(() => process.exit(130));
  });
}

/** Spawns a tracked child; stopAll() stops it if nobody did. */
export function spawnTracked(cmd, args, opts) {
  const child = spawn(cmd, args, opts);
  const stop = onStop(() => stopChild(child));
  child.untrack = () => {
    const i = stoppers.indexOf(stop);
    if (i >= 0) stoppers.splice(i, 1);
  };
  return child;
}
/** TERM (or the given signal), then KILL after 5 s; resolves when the child has exited. */
export async function stopChild(child, signal = 'SIGTERM') {
  child.untrack?.();
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.once('exit', r));
  child.kill(signal);
  const t = setTimeout(() => child.kill('SIGKILL'), 5000);
  await exited;
  clearTimeout(t);
}

/** A fresh embedded PostgreSQL in a temp folder, removed on stop, reached as ours is (its Unix socket unless BENCH_SOCKET=0). Returns { url, dataDir, postmaster }. */
export async function startPostgres(tag) {
  const { startEmbeddedPostgres } = await import(dist('libs/service-kit/src/embedded-postgres.js'));
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `idempotent-orders-${tag}-`));
  fs.chmodSync(dir, 0o755);
  const dataDir = path.join(dir, 'pg');
  // A port the OS says is free now, not a random guess: back-to-back runs (BENCH_ROUNDS) start many servers.
  const port = await freePort();
  onStop(() => fs.rmSync(dir, { recursive: true, force: true }));
  const server = await startEmbeddedPostgres({
    dir: dataDir,
    port,
    socket: process.env.BENCH_SOCKET !== '0',
    log: (l) => process.env.BENCH_DEBUG && console.error(l),
  });
  onStop(() => server.stop());
  const { postmasterPid } = await import(dist('bench/proc-cpu.js'));
  return { url: server.socketUrl ?? server.url, dataDir, postmaster: postmasterPid(dataDir) };
}

export function hasRedis() {
  return process.env.PEER_REDIS !== '0' && spawnSync('sh', ['-c', 'command -v redis-server'], { stdio: 'ignore' }).status === 0;
}

/** redis-server on loopback, no persistence. Returns { url, pid }. */
export async function startRedis() {
  const port = await freePort();
  const child = spawnTracked('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], {
    stdio: 'ignore',
  });
  for (let i = 0; i < 100; i++) {
    const ok = await new Promise((res) => {
      const s = net.connect(port, '127.0.0.1', () => {
        s.end();
        res(true);
      });
      s.once('error', () => res(false));
    });
    if (ok) return { url: `redis://127.0.0.1:${port}`, pid: child.pid, child };
    if (child.exitCode !== null) break;
    await sleep(100);
  }
  await stopChild(child);
  throw new Error('redis-server did not start');
}

async function waitReady(child, url, what, logFile) {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`${what} exited (${child.exitCode}); see ${logFile}`);
    try {
      if ((await fetch(url)).status < 500) return;
    } catch {
      /* not yet */
    }
    await sleep(100);
  }
  await stopChild(child);
  throw new Error(`${what} did not answer ${url} within 60 s; see ${logFile}`);
}

// One folder of app logs per top-level run; probe children inherit it through the environment.
export const logDir = (process.env.PEER_LOG_DIR ??= fs.mkdtempSync(path.join(os.tmpdir(), 'idempotent-orders-peer-logs-')));

/** The peer app (bench/peer/app, built). storage memory|redis. Returns { url, pid, child }. */
export async function startPeer({ databaseUrl, storage = 'memory', redisUrl, env = {}, tag = storage }) {
  const port = await freePort();
  const logFile = path.join(logDir, `peer-${tag}.log`);
  const out = fs.openSync(logFile, 'a');
  const child = spawnTracked(process.execPath, [path.join(here, 'app/dist/main.js')], {
    env: {
      PATH: process.env.PATH,
      DATABASE_URL: databaseUrl,
      STORAGE: storage,
      REDIS_URL: redisUrl ?? '',
      PORT: String(port),
      POOL_MAX: '10',
      ...env,
    },
    stdio: ['ignore', out, out],
  });
  const url = `http://127.0.0.1:${port}`;
  await waitReady(child, `${url}/ping`, `peer app (${storage})`, logFile);
  return { url, pid: child.pid, child };
}

export const OURS_SECRET = 'bench-secret-0123456789';
/** Client ids the probes use against our service, each with its own secret (API_KEYS). */
export const OURS_CLIENTS = Object.fromEntries(
  ['bench', 'p1', 'p2', 'p3a', 'p3b', 'p4'].map((c) => [c, c === 'bench' ? OURS_SECRET : `${c}-probe-secret-0123456789`]),
);

/** Our service (dist/src/main.js) on a given database; it applies the migrations itself. Returns { url, pid, child }. */
export async function startOurs({ databaseUrl, tag = 'ours', env = {} }) {
  const port = await freePort();
  const logFile = path.join(logDir, `${tag}.log`);
  const out = fs.openSync(logFile, 'a');
  const child = spawnTracked(process.execPath, [dist('src/main.js')], {
    env: {
      PATH: process.env.PATH,
      PORT: String(port),
      DATABASE_URL: databaseUrl,
      LOG_LEVEL: 'warn',
      API_KEYS: Object.entries(OURS_CLIENTS)
        .map(([c, s]) => `${c}:${s}`)
        .join(','),
      PSP_WEBHOOK_SECRET: `whsec_${Buffer.from(OURS_SECRET).toString('base64')}`,
      PSP_SANDBOX: 'in-process',
      // On a real database the sandbox's published dev key is refused, as the dev webhook secret is.
      PSP_API_KEY: 'sk_test_bench-peer-provider-key-0123456789',
      ...env,
    },
    stdio: ['ignore', out, out],
  });
  const url = `http://127.0.0.1:${port}`;
  await waitReady(child, `${url}/health`, 'our service', logFile);
  return { url, pid: child.pid, child };
}
