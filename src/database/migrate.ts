/**
 * Migration commands for the embedded server or DATABASE_URL:
 *   node dist/src/database/migrate.js run | revert | show | check | generate <Name>
 * `show` lists every migration, applied or pending, and exits 1 when any is pending.
 * `check` fails when the entities and the migrations disagree (drift); `generate` writes the
 * SQL TypeORM would need into migrations/ for a human to review and comment.
 */
import { writeFileSync } from 'node:fs';
import { DataSource, MigrationExecutor } from 'typeorm';
import { loadDatabaseConfig } from '../config/app-config.js';
import { loadEnvFile } from '../config/load-env-file.js';
import { typeormOptions } from './typeorm-options.js';
import { pspSandboxMigrations } from '#psp-sandbox';
import { applyMigrations, openDatabaseServer } from '#service-kit';

function migrationSource(name: string, up: string[], down: string[]): string {
  const className = `${name}${Date.now()}`;
  const lines = (qs: string[]) => qs.map((q) => `    await queryRunner.query(\`${q.replace(/`/g, '\\`')}\`);`).join('\n');
  return `import type { MigrationInterface, QueryRunner } from 'typeorm';

export class ${className} implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
${lines(up)}
  }

  async down(queryRunner: QueryRunner): Promise<void> {
${lines(down)}
  }
}
`;
}

/**
 * One line per migration, as TypeORM's CLI prints them: `[X] Name` applied, `[ ] Name` pending,
 * plus `[?] Name` for one the database has applied that this build does not know (a newer build
 * ran here). Read-only: unlike DataSource.showMigrations, it does not create the migrations table.
 */
async function migrationStatus(dataSource: DataSource): Promise<{ lines: string[]; pending: number }> {
  const executed = new Set((await new MigrationExecutor(dataSource).getExecutedMigrations()).map((m) => m.name));
  // In the order `run` applies them: by the timestamp that ends every name.
  const known = dataSource.migrations.map((m) => m.name ?? m.constructor.name).sort((a, b) => Number(a.slice(-13)) - Number(b.slice(-13)));
  const lines = known.map((name) => `${executed.has(name) ? '[X]' : '[ ]'} ${name}`);
  const sandbox = new Set(pspSandboxMigrations.map((m) => m.name));
  for (const name of executed) {
    if (known.includes(name)) continue;
    // Applied where the sandbox provider was mounted in-process (or before it had migrations of its own): known, not pending.
    lines.push(
      sandbox.has(name) ? `[X] ${name} (the sandbox provider's; it is not mounted here)` : `[?] ${name} (applied, but not in this build)`,
    );
  }
  const pending = known.filter((name) => !executed.has(name)).length;
  lines.push(
    pending
      ? `${pending} of ${known.length} migrations pending: npm run migration:run applies them`
      : `all ${known.length} migrations are applied`,
  );
  return { lines, pending };
}

async function main(): Promise<number> {
  const [command, name] = process.argv.slice(2);
  // As `npm start` does: ./.env first (the real environment wins), then only what locates the database.
  loadEnvFile();
  const config = loadDatabaseConfig();
  // Next to a running `npm start`, its server is used (never stopped): these commands are short, and
  // migrations take the same advisory lock as a starting service, so they are safe beside one.
  const server = await openDatabaseServer(config, { shareRunning: true });
  if (server.sharedWith) {
    console.error(
      `using the embedded PostgreSQL of pid ${server.sharedWith.pid} (${server.sharedWith.command}), which holds ${config.embeddedPgDir}`,
    );
  }
  // DATABASE_MIGRATION_URL, when set, is PostgreSQL itself (DATABASE_URL may be a pooler).
  // The sandbox provider's tables where `npm start` would mount it (no PSP_BASE_URL, and the embedded database or
  // PSP_SANDBOX=in-process): what it migrates, this migrates and shows.
  const env = process.env;
  const pspSandbox = !env.PSP_BASE_URL && (!config.databaseUrl || env.PSP_SANDBOX?.trim() === 'in-process') ? 'in-process' : 'off';
  const dataSource = new DataSource(typeormOptions(config.databaseMigrationUrl ?? server.url, { lockTimeoutMs: 60_000 }, pspSandbox));
  try {
    await dataSource.initialize();
    switch (command) {
      case 'run': {
        // Under the same advisory lock as a starting service, so the two never migrate at once.
        const applied = await applyMigrations(dataSource);
        console.log(applied.length ? applied.map((name) => `applied ${name}`).join('\n') : 'no pending migrations');
        return 0;
      }
      case 'revert':
        await dataSource.undoLastMigration({ transaction: 'each' });
        console.log('reverted the last migration');
        return 0;
      case 'show': {
        const { lines, pending } = await migrationStatus(dataSource);
        console.log(lines.join('\n'));
        // Non-zero when something is pending, so a deploy script can ask.
        return pending ? 1 : 0;
      }
      case 'check':
      case 'generate': {
        await dataSource.runMigrations({ transaction: 'each' });
        const sql = await dataSource.driver.createSchemaBuilder().log();
        const up = sql.upQueries.map((q) => q.query);
        const down = sql.downQueries.map((q) => q.query).reverse();
        if (command === 'check') {
          if (up.length === 0) {
            console.log('no drift: the migrations build exactly the schema the entities describe');
            return 0;
          }
          console.error(`drift: the entities need SQL the migrations do not have:\n${up.join(';\n')}`);
          return 1;
        }
        if (!name || !/^[A-Z][A-Za-z0-9]*$/.test(name)) throw new Error('usage: generate <PascalCaseName>');
        if (up.length === 0) {
          console.log('nothing to generate: no drift');
          return 0;
        }
        const file = `migrations/${Date.now()}-${name.replace(/[A-Z]/g, (c, i) => (i ? '-' : '') + c.toLowerCase())}.ts`;
        writeFileSync(file, migrationSource(name, up, down));
        console.log(`wrote ${file}: comment each constraint, then list it in migrations/index.ts`);
        return 0;
      }
      default:
        console.error('usage: migrate run | revert | show | check | generate <Name>');
        return 2;
    }
  } finally {
    if (dataSource.isInitialized) await dataSource.destroy();
    await server.stop();
  }
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    console.error(err instanceof Error ? err.message : err);
    process.exit(1);
  },
);
