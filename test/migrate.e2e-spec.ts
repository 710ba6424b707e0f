import { execFile } from 'node:child_process';
import { resolve } from 'node:path';
import { DataSource } from 'typeorm';
import { pspSandboxMigrations } from '#psp-sandbox';
import { migrations } from '../migrations/index';
import { serviceMigrations, typeormOptions } from '../src/database/typeorm-options';
import { ALICE, createTestDatabase } from './support/test-app';

const MIGRATE = resolve(process.cwd(), 'dist/src/database/migrate.js');

/** The built CLI (`npm test` builds first), as `npm run migration:<command>` runs it. */
function migrate(
  command: string,
  databaseUrl: string,
  extra: Record<string, string> = { PSP_SANDBOX: 'in-process' },
): Promise<{ code: number; output: string }> {
  const env = {
    PATH: process.env.PATH ?? '',
    DATABASE_URL: databaseUrl,
    API_KEYS: `${ALICE.clientId}:${ALICE.secret}`,
    LOG_LEVEL: 'silent',
    ...extra,
  };
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

  // Where the sandbox provider is mounted (PSP_SANDBOX=in-process here), its migrations are listed with the service's, in timestamp order.
  const names = serviceMigrations('in-process')
    .map((m) => m.name)
    .sort((a, b) => Number(a.slice(-13)) - Number(b.slice(-13)));

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

  it("on a real provider (PSP_BASE_URL), lists the service's migrations and the sandbox's applied ones as not mounted, none pending", async () => {
    const onAProvider = { PSP_BASE_URL: 'http://provider.invalid/' };
    // Whatever an earlier case left pending, the sandbox's included (the last migration may be one of its own): applied
    // where it is mounted, as a database that once ran it in-process has them all.
    expect((await migrate('run', database.url)).code).toBe(0);
    const { code, output } = await migrate('show', database.url, onAProvider);
    // Less the newer build's migration the case above added.
    const lines = output
      .trim()
      .split('\n')
      .filter((line) => !line.startsWith('[?]'));
    expect(lines.slice(0, migrations.length)).toEqual(migrations.map((m) => `[X] ${m.name}`));
    expect(lines.slice(migrations.length, -1).sort()).toEqual(
      pspSandboxMigrations.map((m) => `[X] ${m.name} (the sandbox provider's; it is not mounted here)`).sort(),
    );
    expect(lines.at(-1)).toBe(`all ${migrations.length} migrations are applied`);
    expect(code).toBe(0);
  });
});
