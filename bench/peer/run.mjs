// npm run bench:peer — the peer (@node-idempotency/nestjs 1.0.4 in a Nest 10 + TypeORM 0.3 app, bench/peer/app)
// on the same workload as `npm run bench` (same body, 32 connections, BENCH_SECONDS per row, 2 s warm-up), against
// its own embedded PostgreSQL; then the same order transaction straight through `pg` (what the database allows).
// CPU per request from /proc: the peer's Node
// process, this run's PostgreSQL server only (postmaster + its children), redis-server.
// PEER_JSON=<file> writes the rows as JSON (compare.mjs). PEER_REDIS=0 skips the Redis rows.
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import autocannon from 'autocannon';
import pg from 'pg';
import { here, root, log, startPostgres, startPeer, startRedis, hasRedis, stopChild, stopAll } from './lib.mjs';

const { processCpuMs, postgresCpuMs, selfCpuMs } = await import(path.join(root, 'dist/bench/proc-cpu.js'));

const CONNECTIONS = 32;
const DURATION_S = Number(process.env.BENCH_SECONDS ?? 8);
const POOL_MAX = 10; // the peer app's pool (POOL_MAX), and the raw pg pool: the same size
// The body `npm run bench` sends (the peer accepts it as is: orderNumber is optional there).
const BODY = JSON.stringify({
  currency: 'EUR',
  items: [
    { sku: 'SKU-1', quantity: 2, unitPriceMinor: 1999 },
    { sku: 'SKU-2', quantity: 1, unitPriceMinor: 500 },
  ],
});
const ITEMS = JSON.parse(BODY).items;

async function measured(targets, workload) {
  const a = {
    app: processCpuMs(targets.appPid),
    pg: postgresCpuMs(targets.postmaster),
    redis: processCpuMs(targets.redisPid),
    self: selfCpuMs(),
  };
  const row = await workload();
  const per = (ms) => (row.requests > 0 ? ms / row.requests : NaN);
  row.serviceCpuMs = targets.appPid ? per(processCpuMs(targets.appPid) - a.app) : undefined;
  row.pgCpuMs = per(postgresCpuMs(targets.postmaster) - a.pg);
  row.redisCpuMs = targets.redisPid ? per(processCpuMs(targets.redisPid) - a.redis) : undefined;
  if (!targets.appPid) row.clientCpuMs = per(selfCpuMs() - a.self);
  return row;
}

async function cannon(name, url, opts) {
  const r = await autocannon({ url, connections: CONNECTIONS, duration: DURATION_S, ...opts });
  return {
    name,
    rps: r.requests.average,
    p50: r.latency.p50,
    p99: r.latency.p99,
    errors: r.errors + r.timeouts + r.non2xx,
    requests: r.requests.total,
  };
}

const token = 'bench'; // the peer's guard takes the bearer token as the client id
const headers = { 'content-type': 'application/json', authorization: `Bearer ${token}` };

async function peerRows(app, targets, storage) {
  const rows = [];
  await autocannon({ url: `${app.url}/ping`, connections: CONNECTIONS, duration: 2 }); // warm-up, as ours (/health)
  const newKeyEach = {
    method: 'POST',
    headers,
    body: BODY,
    requests: [{ setupRequest: (req) => ({ ...req, headers: { ...req.headers, 'idempotency-key': crypto.randomUUID() } }) }],
  };
  await autocannon({ url: `${app.url}/orders`, connections: CONNECTIONS, duration: 2, ...newKeyEach }); // the create path warmed, as ours
  rows.push(await measured(targets, () => cannon(`peer ${storage}: new key each`, `${app.url}/orders`, newKeyEach)));
  // 100 completed keys replayed round robin: the replay workload of `npm run bench`.
  const keys = Array.from({ length: 100 }, () => crypto.randomUUID());
  for (const key of keys) {
    const r = await fetch(`${app.url}/orders`, { method: 'POST', headers: { ...headers, 'idempotency-key': key }, body: BODY });
    if (r.status !== 201) throw new Error(`seeding a replay key: ${r.status} ${await r.text()}`);
  }
  let next = 0;
  rows.push(
    await measured(targets, () =>
      cannon(`peer ${storage}: replay of a completed key`, `${app.url}/orders`, {
        method: 'POST',
        headers,
        body: BODY,
        requests: [{ setupRequest: (req) => ({ ...req, headers: { ...req.headers, 'idempotency-key': keys[next++ % keys.length] } }) }],
      }),
    ),
  );
  if (storage === 'memory') {
    rows.push(await measured(targets, () => cannon('peer: GET /ping (framework floor)', `${app.url}/ping`, {})));
    rows.push(
      await measured(targets, () =>
        cannon('peer app without the interceptor: POST', `${app.url}/orders-noidem`, { method: 'POST', headers, body: BODY }),
      ),
    );
  }
  return rows;
}

// ---- raw pg: plain = order + items; idem = + idempotency row inserted, then completed
async function rawRows(databaseUrl, postmaster) {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: POOL_MAX });
  // An idle client's connection closing as the server stops must not crash the run (pool.end() does not wait for it).
  pool.on('error', () => {});
  try {
    const clientId = 'raw';
    let seq = 0;
    const total = ITEMS.reduce((s, i) => s + i.quantity * i.unitPriceMinor, 0);
    const tx = async (mode) => {
      const key = `raw-${mode}-${++seq}`;
      const c = await pool.connect();
      try {
        await c.query('BEGIN');
        if (mode === 'idem') {
          const fp = crypto.createHash('sha256').update(BODY).digest('hex');
          const r = await c.query(
            `INSERT INTO idempotency_keys (client_id, key, fingerprint, status) VALUES ($1, $2, $3, 'in_progress')
             ON CONFLICT (client_id, key) DO NOTHING RETURNING 1`,
            [clientId, key, fp],
          );
          if (r.rowCount !== 1) throw new Error('unexpected key conflict');
        }
        const o = await c.query(
          `INSERT INTO orders (client_id, order_number, currency, total_minor) VALUES ($1, NULL, 'EUR', $2)
           RETURNING id, status, version, created_at`,
          [clientId, total],
        );
        const row = o.rows[0];
        await c.query(`INSERT INTO order_items (order_id, sku, quantity, unit_price_minor) VALUES ($1, $2, $3, $4), ($1, $5, $6, $7)`, [
          row.id,
          ITEMS[0].sku,
          ITEMS[0].quantity,
          ITEMS[0].unitPriceMinor,
          ITEMS[1].sku,
          ITEMS[1].quantity,
          ITEMS[1].unitPriceMinor,
        ]);
        if (mode === 'idem') {
          const response = {
            id: row.id,
            clientId,
            currency: 'EUR',
            totalMinor: total,
            status: row.status,
            version: row.version,
            createdAt: row.created_at,
            items: ITEMS,
          };
          await c.query(`UPDATE idempotency_keys SET status = 'completed', response = $3 WHERE client_id = $1 AND key = $2`, [
            clientId,
            key,
            JSON.stringify({ statusCode: 201, body: response }),
          ]);
        }
        await c.query('COMMIT');
      } catch (e) {
        await c.query('ROLLBACK').catch(() => {});
        throw e;
      } finally {
        c.release();
      }
    };
    const run = async (name, mode, seconds) => {
      const lat = [];
      let errors = 0;
      const end = performance.now() + seconds * 1000;
      const t0 = performance.now();
      await Promise.all(
        Array.from({ length: CONNECTIONS }, async () => {
          while (performance.now() < end) {
            const s = performance.now();
            try {
              await tx(mode);
              lat.push(performance.now() - s);
            } catch {
              errors++;
            }
          }
        }),
      );
      lat.sort((a, b) => a - b);
      const pct = (p) => lat[Math.min(lat.length - 1, Math.floor((p / 100) * lat.length))];
      return { name, rps: lat.length / ((performance.now() - t0) / 1000), p50: pct(50), p99: pct(99), errors, requests: lat.length };
    };
    const rows = [];
    for (const [name, mode] of [
      ['raw pg: order transaction', 'plain'],
      ['raw pg: order + idempotency row', 'idem'],
    ]) {
      await run(name, mode, 2); // warm-up
      rows.push(await measured({ postmaster }, () => run(name, mode, DURATION_S)));
    }
    return rows;
  } finally {
    await pool.end();
  }
}

async function main() {
  const rows = [];
  const loadAtStart = os.loadavg()[0];
  try {
    log('starting PostgreSQL for the peer');
    const db = await startPostgres('peer-bench');
    // The peer app creates its schema (schema.sql) at start; raw pg uses the same tables.
    const app = await startPeer({ databaseUrl: db.url, storage: 'memory' });
    log(`peer (memory) at ${app.url}; measuring`);
    rows.push(...(await peerRows(app, { appPid: app.pid, postmaster: db.postmaster }, 'memory')));
    await stopChild(app.child);
    if (hasRedis()) {
      const redis = await startRedis();
      const appR = await startPeer({ databaseUrl: db.url, storage: 'redis', redisUrl: redis.url });
      log(`peer (redis) at ${appR.url}; measuring`);
      rows.push(...(await peerRows(appR, { appPid: appR.pid, postmaster: db.postmaster, redisPid: redis.pid }, 'redis')));
      await stopChild(appR.child);
      await stopChild(redis.child);
    } else {
      log('redis-server not installed (or PEER_REDIS=0): no Redis rows');
    }
    log('raw pg');
    rows.push(...(await rawRows(db.url, db.postmaster)));
  } finally {
    await stopAll();
  }
  const ms = (x) => (x === undefined || Number.isNaN(x) ? '–' : x.toFixed(2));
  const load = `load average ${loadAtStart.toFixed(1)} at the start, ${os.loadavg()[0].toFixed(1)} at the end, on ${os.cpus().length} cores`;
  console.log(`\npeer: ${CONNECTIONS} connections, ${DURATION_S} s each; ${load}\n`);
  console.log(
    '| workload | req/s | p50 ms | p99 ms | errors | app CPU ms/req | PostgreSQL CPU ms/req | redis CPU ms/req |\n|---|---:|---:|---:|---:|---:|---:|---:|',
  );
  for (const r of rows) {
    console.log(
      `| ${r.name} | ${r.rps.toFixed(0)} | ${r.p50.toFixed(1)} | ${r.p99.toFixed(1)} | ${r.errors} | ${ms(r.serviceCpuMs ?? r.clientCpuMs)}${r.clientCpuMs !== undefined ? ' (pg client)' : ''} | ${ms(r.pgCpuMs)} | ${ms(r.redisCpuMs)} |`,
    );
  }
  if (process.env.PEER_JSON) {
    const versions = JSON.parse(fs.readFileSync(path.join(here, 'node_modules/@node-idempotency/nestjs/package.json'), 'utf8')).version;
    fs.writeFileSync(
      process.env.PEER_JSON,
      JSON.stringify(
        {
          date: new Date().toISOString(),
          machine: `${os.cpus().length} × ${os.cpus()[0]?.model}`,
          peer: `@node-idempotency/nestjs ${versions}`,
          load,
          rows,
        },
        null,
        2,
      ),
    );
  }
}

main().catch(async (e) => {
  console.error(e);
  await stopAll();
  process.exit(1);
});
