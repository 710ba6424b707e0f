// kill -9 the app while N requests are in flight, restart it, retry the same keys twice.
//   TARGET=peer|ours node probes/p4-crash.mjs [--storage memory|redis] [--n 50] [--kill-at 15] [--post-commit-delay-ms 0]
// Needs DATABASE_URL (and REDIS_URL for the peer's redis store). Starts and stops its own app processes.
import { postOrder, histogram, db, closeDb, rid, report, sleep, arg, client, TARGET } from './common.mjs';
import { startOurs, startPeer, stopChild, stopAll } from '../lib.mjs';

const storage = TARGET === 'ours' ? 'postgres' : arg('storage', 'memory');
const n = Number(arg('n', 50));
const killAt = Number(arg('kill-at', 15));
const delay = arg('post-commit-delay-ms', '0');
const label = `p4 crash storage=${storage}${delay !== '0' ? ` postCommitDelay=${delay}ms` : ''}`;

const start = (tag) =>
  TARGET === 'ours'
    ? startOurs({ databaseUrl: process.env.DATABASE_URL, tag: `p4-ours-${tag}` })
    : startPeer({
        databaseUrl: process.env.DATABASE_URL,
        storage,
        redisUrl: process.env.REDIS_URL,
        env: { POST_COMMIT_DELAY_MS: delay },
        tag: `p4-${storage}-${tag}`,
      });

const { token, clientId } = client('p4');
const keys = Array.from({ length: n }, (_, i) => `k${i}-${rid(3)}`);
// Each key's order is recognisable by its SKU: duplicates show up as several orders for one key.
const bodyOf = (k) => ({
  currency: 'EUR',
  items: [
    { sku: `${k}-1`, quantity: 1, unitPriceMinor: 100 },
    { sku: `${k}-2`, quantity: 2, unitPriceMinor: 50 },
  ],
});
const c = await db();
async function ordersPerKey() {
  const r = await c.query(
    `SELECT i.sku, count(DISTINCT o.id)::int AS n FROM orders o JOIN order_items i ON i.order_id = o.id
      WHERE o.client_id = $1 AND i.sku LIKE '%-1' GROUP BY i.sku`,
    [clientId],
  );
  const m = Object.fromEntries(keys.map((k) => [k, 0]));
  for (const row of r.rows) m[row.sku.slice(0, -2)] = row.n;
  return m;
}
const count = async () => (await c.query('SELECT count(*)::int AS n FROM orders WHERE client_id = $1', [clientId])).rows[0].n;

let redis;
if (TARGET === 'peer' && storage === 'redis') {
  const { createClient } = await import('redis');
  redis = createClient({ url: process.env.REDIS_URL });
  await redis.connect();
}
const rkey = (k) => `node-idempotency:POST:/orders:${k}`;

try {
  // 1. fire N requests, kill -9 once >= killAt orders are committed
  const app1 = await start('1');
  const t0 = performance.now();
  const inflight = keys.map((k) => postOrder({ url: app1.url, key: k, token, body: bodyOf(k) }));
  let committedAtKill = 0;
  while (performance.now() - t0 < 20_000) {
    committedAtKill = await count();
    if (committedAtKill >= killAt) break;
    await sleep(5);
  }
  await stopChild(app1.child, 'SIGKILL');
  const killMs = performance.now() - t0;
  const first = await Promise.all(inflight);
  await sleep(500); // let PostgreSQL abort the killed connections' open transactions
  const committed = await ordersPerKey();

  // 2. restart, retry every key twice (1.5 s apart)
  const app2 = await start('2');
  const retry1 = await Promise.all(keys.map((k) => postOrder({ url: app2.url, key: k, token, body: bodyOf(k) })));
  await sleep(1500);
  const retry2 = await Promise.all(keys.map((k) => postOrder({ url: app2.url, key: k, token, body: bodyOf(k) })));
  const afterRetry = await ordersPerKey();

  // 3. (peer, redis) the 24 h TTL expiring on the stuck keys, simulated by DEL; then retry once more
  let expirySim = null;
  if (redis) {
    const stuck = keys.filter((k) => retry2[keys.indexOf(k)].status === 409);
    const pttl = stuck.length ? await redis.pTTL(rkey(stuck[0])) : null;
    for (const k of stuck) await redis.del(rkey(k));
    const r3 = await Promise.all(stuck.map((k) => postOrder({ url: app2.url, key: k, token, body: bodyOf(k) })));
    const final = await ordersPerKey();
    expirySim = {
      stuck: stuck.length,
      pttlMs: pttl,
      statuses: histogram(r3),
      stuckWithCommittedOrder: stuck.filter((k) => committed[k] > 0).length,
      duplicatesAfterExpiry: stuck.filter((k) => final[k] > 1).length,
    };
  }
  await stopChild(app2.child);

  const dup = keys.filter((k) => afterRetry[k] > 1).length;
  const stuck = retry2.filter((r) => r.status === 409).length;
  const lost = keys.filter((k) => afterRetry[k] === 0).length;
  console.log(
    `${label}: killed at ${killMs.toFixed(0)} ms with ${committedAtKill} orders committed; first responses ${JSON.stringify(histogram(first))}; ` +
      `retry1 ${JSON.stringify(histogram(retry1))}; retry2 ${JSON.stringify(histogram(retry2))}`,
  );
  if (expirySim) {
    console.log(
      `  ${expirySim.stuck} keys stuck 409 (redis PTTL ${expirySim.pttlMs} ms ≈ ${((expirySim.pttlMs ?? 0) / 3.6e6).toFixed(1)} h); after the TTL (simulated by DEL): ` +
        `${JSON.stringify(expirySim.statuses)}, keys with duplicate orders=${expirySim.duplicatesAfterExpiry}`,
    );
  }
  report(
    label,
    `after a restart and 2 retries: keys with duplicate orders=${dup}, keys still 409=${stuck}, keys with no order=${lost} (of ${n})`,
    {
      storage,
      delay,
      killMs,
      committedAtKill,
      first: histogram(first),
      retry1: histogram(retry1),
      retry2: histogram(retry2),
      dup,
      stuck,
      lost,
      expirySim,
    },
  );
} finally {
  if (redis) await redis.quit();
  await closeDb();
  await stopAll();
}
