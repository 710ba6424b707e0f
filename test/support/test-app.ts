import type { NestFastifyApplication } from '@nestjs/platform-fastify';
import { Client, Pool } from 'pg';
import { type AppConfig, loadConfig } from '../../src/config/app-config';
import { typeormOptions } from '../../src/database/typeorm-options';
import { createHttpApp } from '../../src/http-app';
import { DataSource } from 'typeorm';
import { databaseUrl, templateDatabase, testDatabasePrefix, throughPooler } from './test-run';

export const ALICE = { clientId: 'alice', secret: 'alice-secret-0123456789' };
export const BOB = { clientId: 'bob', secret: 'bob-secret-0123456789' };
export const bearer = (client: { secret: string }) => `Bearer ${client.secret}`;
/** The webhook secret of every test app (required with DATABASE_URL): whsec_ + base64 of 32 bytes. */
export const WEBHOOK_SECRET = `whsec_${Buffer.from('test-app-webhook-secret-32-bytes').toString('base64')}`;
/**
 * The provider's secret key of every test app and test sandbox (required with DATABASE_URL): the in-process sandbox
 * takes it, the service's client sends it. A test that calls /psp itself sends PSP_AUTH.
 */
export const PSP_KEY = 'sk_test_test-app-provider-key-0123456789';
export const PSP_AUTH = `Bearer ${PSP_KEY}`;

function env(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run the tests through npm test (Jest's globalSetup sets it)`);
  return value;
}

/**
 * A pg Client or Pool emits 'error' when its server ends a connection it is not using (another
 * file's DROP DATABASE … WITH (FORCE), a restart, pg_terminate_backend); with no listener that
 * crashes the Jest process, and the failure lands on whatever test runs then. The error still
 * reaches the next query on that connection, which is where a test should see it.
 */
export function ignoreIdleErrors<T extends Client | Pool>(pg: T): T {
  (pg as { on(event: 'error', listener: (err: Error) => void): unknown }).on('error', () => undefined);
  return pg;
}

let databases = 0;
let template: Promise<void> | undefined;

/**
 * The first test file to need a database migrates the template; every file clones it (~50 ms
 * instead of a migration run each). An advisory lock keeps parallel Jest workers from racing.
 */
async function ensureTemplate(adminUrl: string, runId: string): Promise<void> {
  const admin = ignoreIdleErrors(new Client({ connectionString: adminUrl }));
  await admin.connect();
  try {
    await admin.query('SELECT pg_advisory_lock(hashtext($1))', [runId]);
    const { rowCount } = await admin.query('SELECT 1 FROM pg_database WHERE datname = $1', [templateDatabase(runId)]);
    if (rowCount) return;
    await admin.query(`CREATE DATABASE ${templateDatabase(runId)}`);
    const dataSource = new DataSource(
      typeormOptions(databaseUrl(adminUrl, templateDatabase(runId)), { lockTimeoutMs: 10_000, poolSize: 1 }),
    );
    await dataSource.initialize();
    try {
      await dataSource.runMigrations({ transaction: 'each' });
    } finally {
      await dataSource.destroy();
    }
  } finally {
    await admin.end();
  }
}

/** A fresh database cloned from the migrated template: each test file has its own. */
/** A database of this run, migrated for the service (from the template), or `empty` for an app with migrations of its own. */
export async function createTestDatabase({ empty = false } = {}): Promise<{ url: string; drop(): Promise<void> }> {
  const adminUrl = env('TEST_ADMIN_URL');
  const runId = env('TEST_RUN_ID');
  if (!empty) {
    template ??= ensureTemplate(adminUrl, runId);
    await template;
  }
  const name = `${testDatabasePrefix(runId)}${process.pid}_${++databases}_${Math.random().toString(36).slice(2, 8)}`;
  const admin = ignoreIdleErrors(new Client({ connectionString: adminUrl }));
  await admin.connect();
  try {
    await admin.query(`CREATE DATABASE ${name} TEMPLATE ${empty ? 'template0' : templateDatabase(runId)}`);
  } finally {
    await admin.end();
  }
  return {
    url: databaseUrl(adminUrl, name),
    drop: async () => {
      const c = ignoreIdleErrors(new Client({ connectionString: adminUrl }));
      await c.connect();
      try {
        await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      } finally {
        await c.end();
      }
    },
  };
}

export function testConfig(url: string, env: Record<string, string> = {}): AppConfig {
  return loadConfig({
    DATABASE_URL: url,
    API_KEYS: `${ALICE.clientId}:${ALICE.secret},${BOB.clientId}:${BOB.secret}`,
    PSP_WEBHOOK_SECRET: WEBHOOK_SECRET,
    PSP_API_KEY: PSP_KEY,
    LOG_LEVEL: 'silent',
    // The sandbox is mounted on a real database only when asked for: every test app asks, unless it names a provider.
    ...(env.PSP_BASE_URL ? {} : { PSP_SANDBOX: 'in-process' }),
    // Nothing stands between a test app and its sandbox, so no request reaches it late: "never reached" may be decided
    // at once, as the tests of reconciling expect. Tests of late landings put a slow path in between and set this.
    PSP_MAX_LATENCY_MS: '0',
    ...env,
  });
}

export interface TestApp {
  app: NestFastifyApplication;
  /** http://127.0.0.1:<port>: the app listens, so parallel requests really are parallel. */
  url: string;
  /** A pool on the same database, for checking what was written. */
  db: Pool;
  databaseUrl: string;
  close(): Promise<void>;
}

export interface TestAppOptions {
  /**
   * Run on this existing database instead of a fresh clone (two instances on one database, or a
   * restart). The caller owns it: close() leaves it in place, drop it yourself (createTestDatabase).
   */
  databaseUrl?: string;
}

/** The app exactly as main.ts builds it, on its own database, listening on a free port. */
export async function startTestApp(env: Record<string, string> = {}, options: TestAppOptions = {}): Promise<TestApp> {
  const database = options.databaseUrl ? { url: options.databaseUrl, drop: () => Promise.resolve() } : await createTestDatabase();
  // pool.end() resolves before the server has closed its connections: the DROP below can still terminate them.
  const db = ignoreIdleErrors(new Pool({ connectionString: database.url, max: 4 }));
  let app: NestFastifyApplication | undefined;
  const close = async () => {
    await app?.close();
    await db.end();
    await database.drop();
  };
  try {
    const config = testConfig(database.url, { ...env, ...throughPooler(database.url, env) });
    const started = await createHttpApp({ config, databaseUrl: config.databaseUrl! });
    app = started;
    await started.listen(0, '127.0.0.1');
    const { port } = started.getHttpServer().address() as { port: number };
    return { app: started, url: `http://127.0.0.1:${port}`, db, databaseUrl: database.url, close };
  } catch (err) {
    await close();
    throw err;
  }
}
