/**
 * The service on three Patroni members behind HAProxy, started as `npm start` starts it (dist/src/main.js, DATABASE_URL
 * naming HAProxy). Synchronous mode: creates under load while the primary's node crashes — no 5xx but 503, every
 * acknowledged order still there afterwards, each exactly once, the outage bounded. Both modes: the banner and /health
 * say whether commits wait for a synchronous standby, and DATABASE_REQUIRE_SYNCHRONOUS_STANDBY refuses one that does not.
 */
import { randomUUID } from 'node:crypto';
import { Client } from 'pg';
import { type HaPostgres, startHaPostgres } from '../support/ha-postgres';
import { runServiceToExit, type ServiceProcess, startServiceProcess } from '../support/service-process';
import { ALICE, bearer } from '../support/test-app';
import { until } from '../support/until';

const SERVICE_ENV = (cluster: HaPostgres) => ({
  DATABASE_URL: cluster.url,
  // HAProxy maps a port to the primary's, no pooler: the migrations' session lock holds through it (docs: Beyond one node).
  DATABASE_MIGRATION_URL: cluster.url,
  // HAProxy forwards TCP to one server: named statements live on that connection like on a direct one.
  DATABASE_PREPARED_STATEMENTS: 'true',
  API_KEYS: `${ALICE.clientId}:${ALICE.secret}`,
  PSP_WEBHOOK_URL: 'none',
});
/** A failover on this machine takes ~11 s (HA.md of the harness); the service must be back well within this. */
const OUTAGE_BOUND_MS = 45_000;

interface Acknowledged {
  orderNumber: string;
  id: string;
}

describe('the service on a synchronous Patroni cluster: the primary crashes under load', () => {
  let cluster: HaPostgres | undefined;
  let service: ServiceProcess | undefined;
  afterAll(async () => {
    await service?.kill('SIGKILL');
    await cluster?.stop();
  }, 120_000);

  it('answers 503 (never 500) while there is no primary, loses no acknowledged order, creates none twice', async () => {
    cluster = await startHaPostgres({ synchronous: true });
    await cluster.untilHealthy();
    service = await startServiceProcess(SERVICE_ENV(cluster));
    expect(service.output()).toContain('commits: acknowledged once a synchronous standby has them');
    const health = (await (await fetch(`${service.url}/health`)).json()) as { databaseCommits: string };
    expect(health.databaseCommits).toBe('synchronous-standby');

    const acknowledged: Acknowledged[] = [];
    const statuses = new Map<string, number>();
    const failures: number[] = [];
    let stop = false;
    /** One client: each order under its own Idempotency-Key, retried with that key until it is answered 2xx. */
    const worker = async () => {
      while (!stop) {
        const orderNumber = `HA-${randomUUID()}`;
        const key = randomUUID();
        const body = JSON.stringify({ orderNumber, currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 500 }] });
        for (;;) {
          const res = await fetch(`${service!.url}/orders`, {
            method: 'POST',
            headers: { authorization: bearer(ALICE), 'idempotency-key': key, 'content-type': 'application/json' },
            body,
            signal: AbortSignal.timeout(20_000),
          }).catch(() => undefined);
          const status = res ? String(res.status) : 'no answer';
          statuses.set(status, (statuses.get(status) ?? 0) + 1);
          if (res && (res.status === 200 || res.status === 201)) {
            acknowledged.push({ orderNumber, id: ((await res.json()) as { id: string }).id });
            break;
          }
          await res?.body?.cancel();
          failures.push(Date.now());
          // A client's retry pause: Retry-After would say seconds; a tenth keeps the outage measured closely.
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
      }
    };
    const workers = Array.from({ length: 6 }, worker);
    await until('orders acknowledged before the crash', 30_000, () => acknowledged.length >= 50, 50);

    const first = await cluster.leader();
    const crashedAt = Date.now();
    await cluster.crashMember(first!);
    await until('a new leader', 60_000, async () => ![undefined, first].includes(await cluster!.leader()), 200);
    // Load goes on until the service has answered 2xx for a while on the new primary.
    const afterCrash = acknowledged.length;
    await until('orders acknowledged on the new primary', 90_000, () => acknowledged.length >= afterCrash + 100, 100);
    stop = true;
    await Promise.all(workers);

    const outageMs = failures.length ? Math.max(...failures) - Math.min(...failures) : 0;
    console.log(
      `ha failover under load: ${acknowledged.length} orders acknowledged, answers ${JSON.stringify(Object.fromEntries(statuses))}, ` +
        `failures for ${outageMs} ms, the first ${Math.min(...failures) - crashedAt} ms after the crash`,
    );
    // 503 (no primary, a pool that cannot connect), 409 (the same key still in flight on a dropped connection): never a 500.
    expect([...statuses.keys()].filter((s) => !['200', '201', '409', '503'].includes(s))).toEqual([]);
    expect(outageMs).toBeLessThan(OUTAGE_BOUND_MS);

    // Every acknowledged order is on the new primary, once; no order exists twice for one order number.
    const db = new Client({ connectionString: cluster.url });
    await db.connect();
    try {
      const { rows } = await db.query<{ order_number: string; id: string }>(
        `SELECT order_number, id FROM orders WHERE order_number = ANY($1::text[])`,
        [acknowledged.map((a) => a.orderNumber)],
      );
      expect(rows.length).toBe(acknowledged.length);
      const found = new Map(rows.map((r) => [r.order_number, r.id]));
      expect(acknowledged.filter((a) => found.get(a.orderNumber) !== a.id)).toEqual([]);
      const twice = await db.query(`SELECT order_number FROM orders WHERE order_number LIKE 'HA-%' GROUP BY 1 HAVING count(*) > 1`);
      expect(twice.rows).toEqual([]);
    } finally {
      await db.end();
    }
  }, 400_000);
});

describe('the service on an asynchronous Patroni cluster', () => {
  let cluster: HaPostgres | undefined;
  let service: ServiceProcess | undefined;
  afterAll(async () => {
    await service?.kill('SIGKILL');
    await cluster?.stop();
  }, 120_000);

  it('says commits are acknowledged by the primary alone, and DATABASE_REQUIRE_SYNCHRONOUS_STANDBY=true refuses to start', async () => {
    cluster = await startHaPostgres({ synchronous: false });
    await cluster.untilHealthy();
    const refused = await runServiceToExit({
      ...SERVICE_ENV(cluster),
      DATABASE_REQUIRE_SYNCHRONOUS_STANDBY: 'true',
      PSP_SANDBOX: 'in-process',
    });
    expect(refused.code).toBe(1);
    expect(refused.output).toContain('DATABASE_REQUIRE_SYNCHRONOUS_STANDBY=true, and the primary acknowledges commits alone');

    service = await startServiceProcess(SERVICE_ENV(cluster));
    expect(service.output()).toContain('commits: acknowledged by the primary alone (no synchronous standby)');
    const health = (await (await fetch(`${service.url}/health`)).json()) as { databaseCommits: string };
    expect(health.databaseCommits).toBe('primary-only');
  }, 300_000);
});
