/**
 * One embedded data folder, one owner: with the service running, the migration commands use its PostgreSQL and
 * a second start is refused in one line; neither ever stops the server the first one runs. Ctrl-C in the
 * terminal reaches the service alone, which answers its requests before it stops PostgreSQL. Uses dist/.
 */
import { execFile } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { Client } from 'pg';
import request from 'supertest';
import { freePort } from '../src/common/free-port';
import { DEV_API_CLIENT } from '../src/config/app-config';
import { serviceMigrations } from '../src/database/typeorm-options';
import { runServiceToExit, type ServiceProcess, startServiceProcess } from './support/service-process';
import { bearer } from './support/test-app';

const MIGRATE = resolve(process.cwd(), 'dist/src/database/migrate.js');
/** A start and a few commands, each up to a minute on a loaded machine: a budget, not a claim. */
const TIMEOUT_MS = 180_000;

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/** Polls `condition` every 20 ms until it holds; past 30 s, fails with `what`. */
async function until(condition: () => boolean | Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(what);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** The built migration CLI, as `npm run migration:<command>` runs it. */
function migrate(command: string, env: Record<string, string>): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((done) => {
    execFile(process.execPath, [MIGRATE, command], { env: { PATH: process.env.PATH ?? '', ...env } }, (err, stdout, stderr) => {
      done({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, stdout, stderr });
    });
  });
}

describe('one embedded data folder, one owner', () => {
  let dir: string;
  let env: Record<string, string>;
  let service: ServiceProcess;
  let postmasterPid: number;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-folder-'));
    // The server runs as the postgres user (we are root in CI): it must be able to enter the folder.
    await chmod(dir, 0o755);
    env = { EMBEDDED_PG_DIR: join(dir, 'pg'), EMBEDDED_PG_PORT: String(await freePort()), IDEMPOTENCY_WAIT_MS: '30000' };
    service = await startServiceProcess(env, { processGroup: true });
    postmasterPid = Number(readFileSync(join(dir, 'pg', 'postmaster.pid'), 'utf8').split('\n')[0]);
  }, TIMEOUT_MS);

  afterAll(async () => {
    await service?.kill('SIGKILL');
    // A server left by a failed assertion must not outlive the test.
    if (postmasterPid && alive(postmasterPid)) process.kill(postmasterPid, 'SIGKILL');
    await rm(dir, { recursive: true, force: true });
  });

  const health = () => request(service.url).get('/health');

  it(
    'migration:show and migration:run use the running server, and it still answers afterwards',
    async () => {
      const show = await migrate('show', env);
      expect(show.code).toBe(0);
      expect(show.stdout).toContain(`all ${serviceMigrations('in-process').length} migrations are applied`);
      expect(show.stderr.trim()).toBe(
        `using the embedded PostgreSQL of pid ${service.child.pid} (node dist/src/main.js), which holds ${env.EMBEDDED_PG_DIR}`,
      );
      expect((await health()).status).toBe(200);

      const run = await migrate('run', env);
      expect(run.code).toBe(0);
      expect(run.stdout.trim()).toBe('no pending migrations');
      expect((await health()).status).toBe(200);
      expect(alive(postmasterPid)).toBe(true);
    },
    TIMEOUT_MS,
  );

  it(
    'the service reaches its embedded PostgreSQL over the Unix socket in the data folder, not over TCP',
    async () => {
      expect((await health()).status).toBe(200);
      const observer = new Client({ connectionString: `postgres://postgres:postgres@127.0.0.1:${env.EMBEDDED_PG_PORT}/postgres` });
      await observer.connect();
      try {
        // PostgreSQL reports client_port -1 for a connection over a Unix-domain socket.
        const { rows } = await observer.query<{ unix: number; tcp: number }>(
          `SELECT count(*) FILTER (WHERE client_port = -1)::int AS unix, count(*) FILTER (WHERE client_port <> -1)::int AS tcp
           FROM pg_stat_activity WHERE application_name = 'idempotent-orders'`,
        );
        expect(rows[0]).toEqual({ unix: expect.any(Number), tcp: 0 });
        expect(rows[0].unix).toBeGreaterThan(0);
      } finally {
        await observer.end();
      }
      expect(existsSync(join(env.EMBEDDED_PG_DIR, `.s.PGSQL.${env.EMBEDDED_PG_PORT}`))).toBe(true);
    },
    TIMEOUT_MS,
  );

  it(
    'a second start on the same folder is refused in one line naming the holder and what to set; the first keeps serving',
    async () => {
      const second = await runServiceToExit({ ...env, PORT: '0' });
      expect(second.code).toBe(1);
      expect(second.output.trim()).toBe(
        `EMBEDDED_PG_DIR ${env.EMBEDDED_PG_DIR} is in use by pid ${service.child.pid} (node dist/src/main.js). ` +
          'Stop that process first, or give this one a folder and ports of its own: EMBEDDED_PG_DIR, EMBEDDED_PG_PORT and PORT.',
      );
      expect((await health()).status).toBe(200);
      const created = await request(service.url)
        .post('/orders')
        .set('Authorization', bearer(DEV_API_CLIENT))
        .set('Idempotency-Key', `after-second-start-${Date.now()}`)
        .send({ currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 100 }] });
      expect(created.status).toBe(201);
    },
    TIMEOUT_MS,
  );

  it(
    "a second start on another folder but the first one's PORT is refused in one line, before it starts a database",
    async () => {
      const other = join(dir, 'other');
      const { port } = new URL(service.url);
      const second = await runServiceToExit({ EMBEDDED_PG_DIR: other, EMBEDDED_PG_PORT: String(await freePort()), PORT: port });
      expect(second.code).toBe(1);
      expect(second.output.trim()).toBe(`PORT ${port} is in use by another program (another npm start?): set PORT to a free port`);
      expect(existsSync(other)).toBe(false);
      expect((await health()).status).toBe(200);
    },
    TIMEOUT_MS,
  );

  it(
    'Ctrl-C (SIGINT to its process group) with a request in flight: the request is answered, then PostgreSQL stops, exit 0',
    async () => {
      const orderNumber = `ctrl-c-${Date.now()}`;
      const holder = new Client({ connectionString: `postgres://postgres:postgres@127.0.0.1:${env.EMBEDDED_PG_PORT}/postgres` });
      // The server stops at the end of this test: that must not be an unhandled 'error'.
      holder.on('error', () => undefined);
      await holder.connect();
      // The create waits on its order number, which the test's own transaction holds.
      await holder.query('BEGIN');
      await holder.query(`INSERT INTO orders (client_id, order_number, currency, total_minor) VALUES ($1, $2, 'EUR', 1)`, [
        DEV_API_CLIENT.clientId,
        orderNumber,
      ]);
      const answer = request(service.url)
        .post('/orders')
        .set('Authorization', bearer(DEV_API_CLIENT))
        .set('Idempotency-Key', orderNumber)
        .send({ currency: 'EUR', orderNumber, items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 100 }] })
        .then((res) => res.status);
      // Settled here too, so a failure before it is awaited below is not also an unhandled rejection.
      answer.catch(() => undefined);
      const waiting = async () =>
        (
          await holder.query(
            `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = 'idempotent-orders' AND wait_event_type = 'Lock'`,
          )
        ).rows[0].n >= 1;
      await until(waiting, 'the create never waited on its order number');

      // What a terminal does on Ctrl-C: the signal to every process of the foreground group.
      process.kill(-service.child.pid!, 'SIGINT');
      await until(() => service.output().includes('SIGINT: stopping'), 'the service never began to stop');
      // The service is draining: PostgreSQL, in a session of its own, did not get the signal.
      expect(alive(postmasterPid)).toBe(true);
      await holder.query('ROLLBACK');
      await holder.end();

      expect(await answer).toBe(201);
      expect(await service.exited).toBe(0);
      expect(alive(postmasterPid)).toBe(false);
      expect(existsSync(join(dir, 'pg', 'postmaster.pid'))).toBe(false);
      // The folder is free again: its owner file went with the service.
      expect(existsSync(`${env.EMBEDDED_PG_DIR}.owner`)).toBe(false);
    },
    TIMEOUT_MS,
  );
});
