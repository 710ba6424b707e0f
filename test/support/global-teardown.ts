import { rm } from 'node:fs/promises';
import { Client } from 'pg';
import { testDatabasePrefix, type TestRun } from './test-run';

export default async function globalTeardown(): Promise<void> {
  const run = (globalThis as { __testRun?: TestRun }).__testRun;
  if (!run) return;
  try {
    if (!run.server) {
      // A shared DATABASE_URL server: drop what this run made, including databases of files that crashed.
      const admin = new Client({ connectionString: run.adminUrl });
      // A connection error must fail the query below, not crash Jest with an unhandled 'error' event.
      admin.on('error', () => undefined);
      await admin.connect();
      try {
        const { rows } = await admin.query<{ datname: string }>(`SELECT datname FROM pg_database WHERE starts_with(datname, $1)`, [
          testDatabasePrefix(run.id),
        ]);
        for (const { datname } of rows) await admin.query(`DROP DATABASE IF EXISTS "${datname}" WITH (FORCE)`);
      } finally {
        await admin.end();
      }
    }
  } finally {
    await run.pooler?.stop().catch(() => undefined);
    await run.server?.stop();
    if (run.dir) await rm(run.dir, { recursive: true, force: true });
  }
}
