/**
 * Starts one PostgreSQL for the whole run: embedded in a temp dir, or DATABASE_URL's server.
 * (test-app.ts builds the migrated template database and a clone of it per test file.)
 * Jest loads this file through require, outside its ESM runtime and module mapper: it may
 * import only files without relative '.js' imports, and has no import.meta or __dirname.
 */
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from '../../src/common/free-port';
import { startEmbeddedPostgres } from '#service-kit/embedded-postgres';
import { startPgBouncer } from './pgbouncer';
import type { TestRun } from './test-run';

export default async function globalSetup(): Promise<void> {
  const run: TestRun = { adminUrl: process.env.DATABASE_URL ?? '', id: `${process.pid}_${Date.now().toString(36)}` };
  try {
    if (!run.adminUrl) {
      run.dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-test-'));
      // PostgreSQL runs as another user (we are root): it must be able to enter the folder.
      await chmod(run.dir, 0o755);
      run.server = await startEmbeddedPostgres({ dir: join(run.dir, 'pg'), port: await freePort(), fast: true });
      run.adminUrl = run.server.url;
    }
    if (process.env.TEST_PGBOUNCER === '1') {
      run.pooler = await startPgBouncer(run.adminUrl, await freePort());
      process.env.TEST_POOLER_PORT = String(run.pooler.port);
    }
    (globalThis as { __testRun?: TestRun }).__testRun = run;
    process.env.TEST_ADMIN_URL = run.adminUrl;
    process.env.TEST_RUN_ID = run.id;
  } catch (err) {
    // Jest skips globalTeardown when setup throws: clean up here.
    await run.pooler?.stop().catch(() => undefined);
    await run.server?.stop().catch(() => undefined);
    if (run.dir) await rm(run.dir, { recursive: true, force: true });
    throw err;
  }
}
