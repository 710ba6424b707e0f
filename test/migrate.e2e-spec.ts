import { execFile } from 'node:child_process';
import { resolve } from 'node:path';
import { DataSource } from 'typeorm';
import { migrations } from '../migrations/index';
import { typeormOptions } from '../src/database/typeorm-options';
import { ALICE, createTestDatabase } from './support/test-app';

const MIGRATE = resolve(process.cwd(), 'dist/src/database/migrate.js');

/** The built CLI (`npm test` builds first), as `npm run migration:<command>` runs it. */
function migrate(command: string, databaseUrl: string): Promise<{ code: number; output: string }> {
  const env = { PATH: process.env.PATH ?? '', DATABASE_URL: databaseUrl, API_KEYS: `${ALICE.clientId}:${ALICE.secret}`, LOG_LEVEL: 'silent' };
  return new Promise((done) => {
    execFile(process.execPath, [MIGRATE, command], { env }, (err, stdout, stderr) => {
      done({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, output: stdout + stderr });
    });
  });
}

describe('npm run migration:show', () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  beforeAll(async () => {
    database = await createTestDatabase();
  });
  afterAll(async () => {
    await database?.drop();
  });

  const names = migrations.map((m) => m.name);

  it('names every migration, applied or pending, and says whether any is pending', async () => {
    const applied = await migrate('show', database.url);
    expect(applied.code).toBe(0);
    expect(applied.output.trim().split('\n')).toEqual([...names.map((n) => `[X] ${n}`), `all ${names.length} migrations are applied`]);

    const dataSource = new DataSource(typeormOptions(database.url, { lockTimeoutMs: 10_000, poolSize: 1 }));
    await dataSource.initialize();
    try {
      await dataSource.undoLastMigration({ transaction: 'each' });
    } finally {
      await dataSource.destroy();
    }

    const pending = await migrate('show', database.url);
    expect(pending.code).toBe(1);
    expect(pending.output.trim().split('\n')).toEqual([
      ...names.slice(0, -1).map((n) => `[X] ${n}`),
      `[ ] ${names[names.length - 1]}`,
      `1 of ${names.length} migrations pending: npm run migration:run applies them`,
    ]);
  });

  it('also names a migration the database has applied but this build does not know (a newer build ran)', async () => {
    const { Client } = await import('pg');
    const db = new Client({ connectionString: database.url });
    await db.connect();
    try {
      await db.query(`INSERT INTO migrations (timestamp, name) VALUES (1999999999999, 'FromANewerBuild1999999999999')`);
    } finally {
      await db.end();
    }
    const { code, output } = await migrate('show', database.url);
    expect(code).toBe(1);
    expect(output).toContain('[?] FromANewerBuild1999999999999 (applied, but not in this build)');
  });
});
