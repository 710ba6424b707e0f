/**
 * The service as an OS process: killed mid-flight, run twice on one database, restarted after
 * a kill -9 of its embedded PostgreSQL's parent, refused a bad config. Uses the build in dist/.
 */
import { randomUUID } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { Agent, request as httpRequest } from 'node:http';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client, Pool } from 'pg';
import request from 'supertest';
import { freePort } from '../src/common/free-port';
import { runServiceToExit, type ServiceProcess, startServiceProcess } from './support/service-process';
import { ALICE, bearer, createTestDatabase } from './support/test-app';

const API_KEYS = `alice:${ALICE.secret}`;
/**
 * Each test starts one or two services and waits for them (up to a minute each, see service-process.ts):
 * on a loaded 2-core machine that alone can pass Jest's 60 s default, which is a budget, not a claim.
 */
const PROCESS_TEST_TIMEOUT_MS = 180_000;
const order = (note: string) => ({ currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 100 }], note });

describe('the service process on a shared database', () => {
  let database: { url: string; drop(): Promise<void> };
  let db: Pool;
  const services: ServiceProcess[] = [];
  const start = async (env: Record<string, string> = {}) => {
    const service = await startServiceProcess({ DATABASE_URL: database.url, API_KEYS, ...env });
    services.push(service);
    return service;
  };

  beforeAll(async () => {
    database = await createTestDatabase();
    db = new Pool({ connectionString: database.url, max: 2 });
  });
  afterAll(async () => {
    await Promise.all(services.map((s) => s.kill('SIGKILL')));
    await db?.end();
    await database?.drop();
  });

  const post = (url: string, key: string, note: string) =>
    request(url).post('/orders').set('Authorization', bearer(ALICE)).set('Idempotency-Key', key).send(order(note));
  /** Requests of the service waiting on a row lock (one the test's own transaction holds). */
  const lockWaiters = async () =>
    (
      await db.query(
        `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'idempotent-orders' AND wait_event_type = 'Lock'`,
      )
    ).rows[0].n as number;
  /** Polls `condition` every 20 ms until it holds; past 30 s, fails with `what`. */
  const until = async (condition: () => boolean | Promise<boolean>, what: string) => {
    const deadline = Date.now() + 30_000;
    while (!(await condition())) {
      if (Date.now() > deadline) throw new Error(what);
      await new Promise((r) => setTimeout(r, 20));
    }
  };

  it(
    'SIGKILL with requests in flight: every key retried afterwards has exactly one order, and no key is stuck',
    async () => {
      // Long enough that the held requests are still waiting when the kill comes, however loaded the machine.
      const first = await start({ IDEMPOTENCY_WAIT_MS: '30000', DATABASE_POOL_WAIT_MS: '30000' });
      const keys = Array.from({ length: 60 }, () => randomUUID());
      const body = (key: string) => ({ ...order(`crash-${key}`), orderNumber: `crash-${key}` });
      const send = (url: string, key: string) =>
        request(url).post('/orders').set('Authorization', bearer(ALICE)).set('Idempotency-Key', key).send(body(key));
      // Ten requests are certainly mid-flight at the kill: the test's own transaction holds their order numbers.
      const held = keys.slice(0, 10);
      const holder = new Client({ connectionString: database.url });
      await holder.connect();
      try {
        await holder.query('BEGIN');
        for (const key of held) {
          await holder.query(`INSERT INTO orders (client_id, order_number, currency, total_minor) VALUES ('alice', $1, 'EUR', 1)`, [
            `crash-${key}`,
          ]);
        }
        const outcomes = keys.map((key) =>
          send(first.url, key).then(
            (res) => res.status,
            () => 'lost' as const,
          ),
        );
        await until(async () => (await lockWaiters()) >= held.length, 'the held requests never waited on their order numbers');
        await first.kill('SIGKILL');
        const settled = await Promise.all(outcomes);
        // The held ones were cut off; the rest answered 201 or were cut off too, never anything else.
        expect(settled.slice(0, 10)).toEqual(Array(10).fill('lost'));
        for (const outcome of settled.slice(10)) expect([201, 'lost']).toContain(outcome);
      } finally {
        await holder.query('ROLLBACK');
        await holder.end();
      }

      const second = await start();
      for (const key of keys) {
        const res = await send(second.url, key);
        expect(res.status).toBe(201);
      }
      const { rows } = await db.query(
        `SELECT count(*)::int AS orders, count(DISTINCT note)::int AS notes,
              (SELECT count(*)::int FROM idempotency_keys WHERE state = 'in_progress') AS stuck,
              (SELECT count(*)::int FROM idempotency_keys WHERE state = 'completed') AS completed
         FROM orders WHERE note LIKE 'crash-%'`,
      );
      expect(rows[0]).toEqual({ orders: 60, notes: 60, stuck: 0, completed: 60 });
    },
    PROCESS_TEST_TIMEOUT_MS,
  );

  it(
    'SIGTERM with a request in flight on a keep-alive connection: it is answered, its connection closed, and the stop ends in time',
    async () => {
      const service = await start();
      const key = randomUUID();
      const holder = new Client({ connectionString: database.url });
      await holder.connect();
      const agent = new Agent({ keepAlive: true });
      try {
        // The create waits on its order number, which the test's own transaction holds.
        await holder.query('BEGIN');
        await holder.query(`INSERT INTO orders (client_id, order_number, currency, total_minor) VALUES ('alice', $1, 'EUR', 1)`, [
          `drain-${key}`,
        ]);
        const answer = new Promise<{ status: number; connection: string | undefined }>((resolve, reject) => {
          const body = JSON.stringify({ ...order('drain'), orderNumber: `drain-${key}` });
          const req = httpRequest(`${service.url}/orders`, {
            method: 'POST',
            agent,
            headers: {
              authorization: bearer(ALICE),
              'idempotency-key': key,
              'content-type': 'application/json',
              'content-length': Buffer.byteLength(body),
            },
          });
          req.on('response', (res) => {
            res.resume();
            res.on('end', () => resolve({ status: res.statusCode ?? 0, connection: res.headers.connection }));
          });
          req.on('error', reject);
          req.end(body);
        });
        // Settled here too, so a failure before it is awaited below is not also an unhandled rejection.
        answer.catch(() => undefined);
        await until(async () => (await lockWaiters()) >= 1, 'the create never waited on its order number');
        const stopped = service.kill('SIGTERM');
        // The stop has begun (it logs first); now let the held create finish.
        await until(() => service.output().includes('SIGTERM: stopping'), 'the service never began to stop');
        await holder.query('ROLLBACK');
        // Its order number is free again: the create goes through, and says it closes the connection.
        expect(await answer).toEqual({ status: 201, connection: 'close' });
        // Exit 1 would mean the stop's 10 s deadline cut it short: the kept-alive connection held it open.
        expect(await stopped).toBe(0);
      } finally {
        agent.destroy();
        await holder.end();
      }
    },
    PROCESS_TEST_TIMEOUT_MS,
  );

  it(
    'two processes on one database: 20 parallel duplicates across both execute once',
    async () => {
      const [a, b] = await Promise.all([start(), start()]);
      const key = randomUUID();
      const responses = await Promise.all(Array.from({ length: 20 }, (_, i) => post(i % 2 ? a.url : b.url, key, 'two-processes')));
      const created = responses.filter((r) => r.status === 201);
      for (const r of responses.filter((r) => r.status !== 201)) {
        expect(r.status).toBe(409);
        expect(r.headers['retry-after']).toBe('1');
      }
      expect(new Set(created.map((r) => r.text)).size).toBe(1);
      expect(created.filter((r) => r.headers['idempotent-replayed'] !== 'true')).toHaveLength(1);
      const { rows } = await db.query(`SELECT count(*)::int AS n FROM orders WHERE note = 'two-processes'`);
      expect(rows[0].n).toBe(1);
    },
    PROCESS_TEST_TIMEOUT_MS,
  );

  it(
    'refuses to start on a bad variable, naming it',
    async () => {
      const { code, output } = await runServiceToExit({ DATABASE_URL: database.url, API_KEYS, PORT: 'eighty' });
      expect(code).toBe(1);
      expect(output).toContain('PORT must be a whole number from 0 to 65535 (got "eighty")');
      const noKeys = await runServiceToExit({ DATABASE_URL: database.url });
      expect(noKeys.code).toBe(1);
      expect(noKeys.output).toContain('API_KEYS is required when DATABASE_URL is set');
      // Every bad variable in the one refusal, not one per start.
      const several = await runServiceToExit({
        DATABASE_URL: database.url,
        PSP_SANDBOX: 'in-process',
        PSP_WEBHOOK_SECRET: '',
        PORT: 'eighty',
      });
      expect(several.code).toBe(1);
      expect(several.output.trim().split('\n')).toEqual([
        'Invalid configuration (3 variables):',
        '  API_KEYS is required when DATABASE_URL is set (got "")',
        '  PSP_WEBHOOK_SECRET is required when DATABASE_URL is set, and must not be the published dev secret (got "")',
        '  PORT must be a whole number from 0 to 65535 (got "eighty")',
      ]);
    },
    PROCESS_TEST_TIMEOUT_MS,
  );

  it(
    'a DATABASE_URL nobody answers at: says where it connects at once (no password), then one line naming DATABASE_URL',
    async () => {
      const port = await freePort();
      const started = Date.now();
      const { code, output } = await runServiceToExit({
        DATABASE_URL: `postgres://orders:Sup3rS3cret@127.0.0.1:${port}/orders`,
        API_KEYS,
        PSP_SANDBOX: 'in-process',
      });
      expect(code).toBe(1);
      expect(output.trim().split('\n')).toEqual([
        `connecting to DATABASE_URL (orders@127.0.0.1:${port}/orders)`,
        `Cannot connect to the database of DATABASE_URL (orders@127.0.0.1:${port}/orders): connect ECONNREFUSED 127.0.0.1:${port}`,
      ]);
      expect(output).not.toContain('Sup3rS3cret');
      // Not TypeORM's ten retries three seconds apart.
      expect(Date.now() - started).toBeLessThan(20_000);
    },
    PROCESS_TEST_TIMEOUT_MS,
  );
});

describe('the service process on its embedded PostgreSQL', () => {
  let dir: string;
  let service: ServiceProcess | undefined;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-embedded-'));
    // The server runs as the postgres user (we are root in CI): it must be able to enter the folder.
    await chmod(dir, 0o755);
  });
  afterAll(async () => {
    await service?.kill('SIGKILL');
    // An orphaned server from a failed assertion must not outlive the test.
    const pidFile = join(dir, 'pg', 'postmaster.pid');
    if (existsSync(pidFile)) {
      const pid = Number(readFileSync(pidFile, 'utf8').split('\n')[0]);
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
    await rm(dir, { recursive: true, force: true });
  });

  it(
    'comes back after kill -9 with every acknowledged order, and stops cleanly on SIGTERM',
    async () => {
      const env = { EMBEDDED_PG_DIR: join(dir, 'pg'), EMBEDDED_PG_PORT: String(await freePort()) };
      service = await startServiceProcess(env);
      expect(service.output()).toContain('dev API key');
      // npm start without AMQP_URL: no broker needed, and the banner says where the order events go (nowhere yet).
      expect(service.output()).toContain('order events: relay off (AMQP_URL unset): events wait in the order_events_outbox table');
      const dev = { secret: 'dev-secret-change-me' };
      const created = await request(service.url)
        .post('/orders')
        .set('Authorization', bearer(dev))
        .set('Idempotency-Key', randomUUID())
        .send(order('survivor'));
      expect(created.status).toBe(201);

      await service.kill('SIGKILL');
      // Its PostgreSQL is orphaned, still holding the data folder: the next start must deal with it.
      const pid = Number(readFileSync(join(dir, 'pg', 'postmaster.pid'), 'utf8').split('\n')[0]);
      expect(() => process.kill(pid, 0)).not.toThrow();

      service = await startServiceProcess(env);
      const read = await request(service.url).get(`/orders/${created.body.id}`).set('Authorization', bearer(dev));
      expect(read.status).toBe(200);
      expect(read.body.note).toBe('survivor');

      expect(await service.kill('SIGTERM')).toBe(0);
      expect(existsSync(join(dir, 'pg', 'postmaster.pid'))).toBe(false);
      service = undefined;
    },
    PROCESS_TEST_TIMEOUT_MS,
  );
});
