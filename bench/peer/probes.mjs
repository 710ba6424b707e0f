// npm run bench:probes — the peer's faults, each run against the
// peer AND against our service, printed per fault: peer result vs ours.
//   npm run bench:probes                 all probes (~2–3 min)
//   npm run bench:probes -- --only p3    one probe (p1 parallel, p2 key order, p3 scoping, p4 crash)
// Every probe runs as a child with a deadline (PROBE_TIMEOUT_S, 120): past it, its process group is killed.
// The peer's Redis store is probed when redis-server is installed (PEER_REDIS=0 skips it); else its memory store only.
// Each side gets its own embedded PostgreSQL (the schemas differ); both are stopped and removed at the end.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { here, arg, log, logDir, startPostgres, startPeer, startOurs, startRedis, hasRedis, stopChild, stopAll } from './lib.mjs';

const only = arg('only', '');
const want = (p) => !only || only.split(',').includes(p);
const TIMEOUT_S = Number(process.env.PROBE_TIMEOUT_S ?? 120);
const results = [];

/** Runs one probe script; resolves with its PROBE record (or an error record on failure / timeout). */
function probe(script, args, env) {
  return new Promise((resolve) => {
    // Its own process group, so a timeout takes down the apps a crash probe started as well.
    const child = spawn(process.execPath, [path.join(here, 'probes', script), ...args], {
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'inherit'],
      detached: true,
    });
    let out = '';
    child.stdout.on('data', (c) => {
      out += c;
      for (const line of c.toString().split('\n')) if (line && !line.startsWith('PROBE ')) console.log(`  ${line}`);
    });
    const killGroup = (sig) => {
      try {
        process.kill(-child.pid, sig);
      } catch {
        /* gone */
      }
    };
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      log(`${script}: over ${TIMEOUT_S} s, stopping it`);
      killGroup('SIGTERM');
      setTimeout(() => killGroup('SIGKILL'), 5000).unref();
    }, TIMEOUT_S * 1000);
    const stop = () => killGroup('SIGKILL');
    process.once('exit', stop);
    child.once('exit', (code) => {
      clearTimeout(timer);
      process.off('exit', stop);
      killGroup('SIGKILL'); // anything the probe left behind in its group
      const line = out.split('\n').find((l) => l.startsWith('PROBE '));
      const rec = line
        ? JSON.parse(line.slice(6))
        : { probe: script, target: env.TARGET, failed: timedOut ? `stopped at its ${TIMEOUT_S} s deadline` : `exit ${code}` };
      results.push(rec);
      resolve(rec);
    });
  });
}

async function httpProbes(target, url, databaseUrl, label) {
  const env = { TARGET: target, APP_URL: url, DATABASE_URL: databaseUrl };
  if (want('p1')) await probe('p1-parallel.mjs', ['--label', label], env);
  if (want('p2')) await probe('p2-keyorder.mjs', ['--label', label], env);
  if (want('p3')) await probe('p3-scoping.mjs', ['--label', label], env);
}

async function main() {
  const redisToo = hasRedis();
  log('starting two PostgreSQL servers (peer, ours)');
  const [peerDb, oursDb] = await Promise.all([startPostgres('probes-peer'), startPostgres('probes-ours')]);
  const redis = redisToo ? await startRedis() : undefined;
  if (!redisToo) log("redis-server not installed (or PEER_REDIS=0): the peer's Redis store is not probed");

  console.log('\n# the peer (@node-idempotency/nestjs, memory store)');
  let app = await startPeer({ databaseUrl: peerDb.url, storage: 'memory', tag: 'probes-memory' });
  await httpProbes('peer', app.url, peerDb.url, 'memory');
  await stopChild(app.child);
  if (redis) {
    console.log('\n# the peer (redis store)');
    app = await startPeer({ databaseUrl: peerDb.url, storage: 'redis', redisUrl: redis.url, tag: 'probes-redis' });
    await httpProbes('peer', app.url, peerDb.url, 'redis');
    await stopChild(app.child);
  }
  if (want('p4')) {
    const env = { TARGET: 'peer', DATABASE_URL: peerDb.url, REDIS_URL: redis?.url ?? '' };
    await probe('p4-crash.mjs', ['--storage', 'memory'], env);
    if (redis) {
      await probe('p4-crash.mjs', ['--storage', 'redis'], env);
      // Orders committed but the response not yet stored: those keys are stuck, then executed again after the TTL.
      await probe('p4-crash.mjs', ['--storage', 'redis', '--post-commit-delay-ms', '300'], env);
    }
  }

  console.log('\n# ours (the service, dist/src/main.js)');
  app = await startOurs({ databaseUrl: oursDb.url, tag: 'probes-ours' });
  await httpProbes('ours', app.url, oursDb.url, '');
  await stopChild(app.child);
  if (want('p4')) await probe('p4-crash.mjs', [], { TARGET: 'ours', DATABASE_URL: oursDb.url });
}

function summary() {
  const of = (target, prefix) => results.filter((r) => r.target === target && r.probe.startsWith(prefix));
  const cell = (recs, fmt) =>
    recs.length ? recs.map((r) => (r.failed ? `${r.probe}: probe failed (${r.failed})` : fmt(r))).join('<br>') : 'not run';
  const tag = (r) => {
    const m = /\[?(memory|redis)\]?$/.exec(r.probe) ?? /storage=(\w+)/.exec(r.probe);
    return m ? `${m[1]}: ` : '';
  };
  const p4tag = (r) =>
    r.target === 'ours'
      ? 'PostgreSQL key table'
      : `${r.storage} store${r.delay && r.delay !== '0' ? `, response stored ≤ ${r.delay} ms after commit` : ''}`;
  const rows = [
    [
      "cross-client replay: client B sends A's key",
      'p3',
      'p3',
      (r) =>
        `${tag(r)}B gets ${r.leaked ? "**A's order** (" + r.bSame + (r.bSameReplayed ? ' replayed' : '') + ')' : `its own order (${r.bSame})`}; orders A=${r.ordersA} B=${r.ordersB}`,
    ],
    [
      'reordered JSON keys, same key → 422',
      'p2',
      'p2',
      (r) =>
        `${tag(r)}${r.rejected}/3 variants rejected 422 (${Object.entries(r.out)
          .map(([k, v]) => `${k}: ${v.second}${v.replayed ? ' replayed' : ''}`)
          .join(', ')})`,
    ],
    [
      'keys stuck after a kill -9 (409 after restart)',
      'p4',
      'p4',
      (r) =>
        `${p4tag(r)}: ${r.stuck}/50 keys still 409 after restart${r.expirySim ? ` (TTL ${((r.expirySim.pttlMs ?? 0) / 3.6e6).toFixed(0)} h)` : ''}`,
    ],
    [
      'duplicates after a restart (kill -9, retry)',
      'p4',
      'p4',
      (r) =>
        `${p4tag(r)}: ${r.dup} keys with 2+ orders after retries${r.expirySim ? `; ${r.expirySim.duplicatesAfterExpiry} more once the 24 h TTL expires (simulated by DEL)` : ''}; ${r.lost} keys with no order yet`,
    ],
    ['20 parallel requests, one new key', 'p1', 'p1', (r) => `${tag(r)}${r.orders} order(s); ${JSON.stringify(r.statuses)}`],
  ];
  console.log('\n| fault | rerun | the peer | ours |\n|---|---|---|---|');
  for (const [fault, id, , fmt] of rows) {
    console.log(`| ${fault} | \`npm run bench:probes -- --only ${id}\` | ${cell(of('peer', id), fmt)} | ${cell(of('ours', id), fmt)} |`);
  }
}

main()
  .catch((e) => {
    console.error(e);
    process.exitCode = 1;
  })
  .finally(async () => {
    await stopAll();
    summary();
    log(`app logs: ${logDir}`);
  });
