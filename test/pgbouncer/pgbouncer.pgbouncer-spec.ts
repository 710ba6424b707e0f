/**
 * The service behind a real PgBouncer in transaction mode (Debian's 1.18: no startup `options`, no
 * named statements kept): it starts, a wrong setting is refused at start-up with the variable named,
 * and a restart of the pooler under load is answered 503 + Retry-After and recovered from by itself.
 * `npm run test:pgbouncer` runs these (they need the `pgbouncer` binary), with the concurrency-heavy suites.
 */
import { randomUUID } from 'node:crypto';
import { Pool } from 'pg';
import request from 'supertest';
import { freePort } from '../../src/common/free-port';
import { type PgBouncer, startPgBouncer } from '../support/pgbouncer';
import { runServiceToExit, type ServiceProcess, startServiceProcess } from '../support/service-process';
import { ALICE, bearer, createTestDatabase, ignoreIdleErrors } from '../support/test-app';

const PROBLEM_JSON = /^application\/problem\+json/;
const ANSWER_DEADLINE_MS = 20_000;
const RECOVERY_DEADLINE_MS = 30_000;
const LOAD_WORKERS = 4;

const order = (note: string) => ({ currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 100 }], note });

async function until(what: string, condition: () => Promise<boolean> | boolean, deadlineMs = RECOVERY_DEADLINE_MS): Promise<void> {
  const deadline = Date.now() + deadlineMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

interface Outcome {
  key: string;
  phase: 'before' | 'down' | 'after';
  status: number | 'no answer';
  id?: string;
  problem?: { contentType?: string; retryAfter?: string; type?: string };
}

describe('behind PgBouncer in transaction mode', () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let bouncer: PgBouncer;
  let pooledUrl: string;
  let db: Pool;
  let service: ServiceProcess | undefined;

  beforeAll(async () => {
    database = await createTestDatabase();
    bouncer = await startPgBouncer(database.url, await freePort());
    pooledUrl = bouncer.pooledUrl(database.url);
    db = ignoreIdleErrors(new Pool({ connectionString: database.url, max: 2 }));
  });
  afterAll(async () => {
    await service?.kill('SIGKILL');
    await db?.end();
    await bouncer?.stop();
    await database?.drop();
  });

  it('named statements left at their default through a pooler: start-up refuses, naming DATABASE_PREPARED_STATEMENTS', async () => {
    const { code, output } = await runServiceToExit({ DATABASE_URL: pooledUrl, DATABASE_MIGRATION_URL: database.url, API_KEYS: `${ALICE.clientId}:${ALICE.secret}`, PSP_SANDBOX: 'in-process' });
    expect(code).toBe(1);
    expect(output).toContain('Invalid configuration: DATABASE_PREPARED_STATEMENTS must be set');
    expect(output).toContain('connection pooler');
  });

  it("migrations through a pooler, with no direct URL for their session lock: start-up refuses, naming DATABASE_MIGRATION_URL", async () => {
    const { code, output } = await runServiceToExit({ DATABASE_URL: pooledUrl, DATABASE_PREPARED_STATEMENTS: 'false', API_KEYS: `${ALICE.clientId}:${ALICE.secret}`, PSP_SANDBOX: 'in-process' });
    expect(code).toBe(1);
    expect(output).toContain('Invalid configuration: DATABASE_MIGRATION_URL must be set');
    // Refused before taking any lock: nothing was left held on a server connection of the pooler.
    const { rows } = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory'`);
    expect(rows[0].n).toBe(0);
  });

  it('a restart of the pooler under load: 503 + Retry-After meanwhile, then it serves again; every acknowledged create kept', async () => {
    service = await startServiceProcess({
      DATABASE_URL: pooledUrl,
      DATABASE_PREPARED_STATEMENTS: 'false',
      DATABASE_MIGRATION_URL: database.url,
      API_KEYS: `${ALICE.clientId}:${ALICE.secret}`,
      DATABASE_POOL_SIZE: '4',
      DATABASE_POOL_WAIT_MS: '2000',
    });
    const svc = service;
    let phase: Outcome['phase'] = 'before';
    let loading = true;
    const outcomes: Outcome[] = [];
    const create = async (key: string): Promise<Outcome> => {
      const at = phase;
      try {
        const res = await request(svc.url)
          .post('/orders')
          .set('Authorization', bearer(ALICE))
          .set('Idempotency-Key', key)
          .timeout(ANSWER_DEADLINE_MS)
          .send(order(`bouncer-${key}`));
        return {
          key,
          phase: at,
          status: res.status,
          id: res.status === 201 ? (res.body as { id: string }).id : undefined,
          problem: res.status >= 400 ? { contentType: res.headers['content-type'], retryAfter: res.headers['retry-after'], type: (res.body as { type?: string }).type } : undefined,
        };
      } catch {
        return { key, phase: at, status: 'no answer' };
      }
    };
    // A bounded loop per worker: it stops when told, or after enough requests that a stuck test still ends.
    const workers = Array.from({ length: LOAD_WORKERS }, async () => {
      for (let i = 0; loading && i < 5_000; i++) outcomes.push(await create(randomUUID()));
    });
    const count = (p: Outcome['phase'], status: Outcome['status']) => outcomes.filter((o) => o.phase === p && o.status === status).length;

    try {
      await until('creates flow', () => count('before', 201) >= 20);

      await bouncer.down();
      phase = 'down';
      await until('the load meets the outage', () => {
        if (svc.child.exitCode !== null || svc.child.signalCode !== null) throw new Error(`the service died:\n${svc.output()}`);
        return count('down', 503) >= 10;
      });
      const refused = await request(svc.url)
        .post('/orders')
        .set('Authorization', bearer(ALICE))
        .set('Idempotency-Key', randomUUID())
        .timeout(ANSWER_DEADLINE_MS)
        .send(order('during-outage'));
      expect({ status: refused.status, contentType: refused.headers['content-type'] }).toEqual({ status: 503, contentType: expect.stringMatching(PROBLEM_JSON) });
      expect(refused.body).toMatchObject({ type: 'urn:idempotent-orders:problem:database-unavailable', status: 503 });
      expect(Number(refused.headers['retry-after'])).toBeGreaterThan(0);

      await bouncer.start();
      phase = 'after';
      await until('/health reports the database up', async () => (await request(svc.url).get('/health').timeout(ANSWER_DEADLINE_MS)).status === 200);
      await until('creates flow again', () => count('after', 201) >= 20);
    } finally {
      loading = false;
      await Promise.all(workers);
    }

    expect(svc.child.exitCode).toBeNull();
    expect(svc.output()).not.toMatch(/Unhandled 'error' event|Connection terminated unexpectedly\n\s+at /);
    // Every answer was a success or a clean, retryable 503: no 500, no hang.
    expect([...new Set(outcomes.map((o) => o.status))].sort()).toEqual([201, 503]);
    for (const o of outcomes.filter((x) => x.status === 503)) {
      expect(o.problem).toEqual({ contentType: expect.stringMatching(PROBLEM_JSON), retryAfter: expect.stringMatching(/^\d+$/), type: expect.stringMatching(/database-unavailable|overloaded/) });
    }

    const acknowledged = outcomes.filter((o) => o.status === 201).map((o) => o.id!);
    const { rows: found } = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM orders WHERE id = ANY($1::uuid[])`, [acknowledged]);
    expect(found[0].n).toBe(acknowledged.length);

    // A refused create, retried with its key, runs exactly once (or replays what a cut-off COMMIT did).
    const refusedKeys = outcomes.filter((o) => o.status === 503).map((o) => o.key).slice(0, 20);
    for (const key of refusedKeys) expect((await create(key)).status).toBe(201);
    const { rows } = await db.query<{ orders: number; keys: number; stuck: number }>(
      `SELECT (SELECT count(*)::int FROM orders WHERE note = ANY($1::text[])) AS orders,
              (SELECT count(DISTINCT note)::int FROM orders WHERE note = ANY($1::text[])) AS keys,
              (SELECT count(*)::int FROM idempotency_keys WHERE state = 'in_progress') AS stuck`,
      [refusedKeys.map((k) => `bouncer-${k}`)],
    );
    expect(rows[0]).toEqual({ orders: refusedKeys.length, keys: refusedKeys.length, stuck: 0 });
  }, 180_000);
});
