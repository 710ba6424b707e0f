/**
 * The service behind a real PgBouncer in transaction mode (Debian's 1.18: no startup `options`, no
 * named statements kept): it starts, a wrong setting is refused at start-up with the variable named,
 * and a restart of the pooler under load is answered 503 + Retry-After and recovered from by itself.
 * `npm run test:pgbouncer` runs these (they need the `pgbouncer` binary), with the concurrency-heavy suites.
 */
import { Pool } from 'pg';
import { freePort } from '../../src/common/free-port';
import {
  createsUnderLoad,
  expectOnlyCleanRefusals,
  expectRecovery,
  expectRefusedMeanwhile,
  expectStillServing,
  until,
} from '../support/outage-load';
import { type PgBouncer, startPgBouncer } from '../support/pgbouncer';
import { runServiceToExit, type ServiceProcess, startServiceProcess } from '../support/service-process';
import { ALICE, createTestDatabase, ignoreIdleErrors } from '../support/test-app';

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
    const { code, output } = await runServiceToExit({
      DATABASE_URL: pooledUrl,
      DATABASE_MIGRATION_URL: database.url,
      API_KEYS: `${ALICE.clientId}:${ALICE.secret}`,
      PSP_SANDBOX: 'in-process',
    });
    expect(code).toBe(1);
    expect(output).toContain('Invalid configuration: DATABASE_PREPARED_STATEMENTS must be set');
    expect(output).toContain('connection pooler');
  });

  it('migrations through a pooler, with no direct URL for their session lock: start-up refuses, naming DATABASE_MIGRATION_URL', async () => {
    const { code, output } = await runServiceToExit({
      DATABASE_URL: pooledUrl,
      DATABASE_PREPARED_STATEMENTS: 'false',
      API_KEYS: `${ALICE.clientId}:${ALICE.secret}`,
      PSP_SANDBOX: 'in-process',
    });
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
    const load = createsUnderLoad(svc.url, 'bouncer-');
    try {
      await until('creates flow', () => load.count('before', 201) >= 20);

      await bouncer.down();
      load.enter('down');
      await until('the load meets the outage', () => {
        if (svc.child.exitCode !== null || svc.child.signalCode !== null) throw new Error(`the service died:\n${svc.output()}`);
        return load.count('down', 503) >= 10;
      });
      await expectRefusedMeanwhile(svc.url);

      await bouncer.start();
      await expectRecovery(load, svc.url);
    } finally {
      await load.stop();
    }

    expectStillServing(svc);
    await expectOnlyCleanRefusals(load, db, 'bouncer-');
  }, 180_000);
});
