/**
 * Migration commands for the embedded server or DATABASE_URL:
 *   node dist/src/database/migrate.js run | revert | show | check | generate <Name>
 * `check` fails when the entities and the migrations disagree (drift); `generate` writes the
 * SQL TypeORM would need into migrations/ for a human to review and comment.
 */
import { writeFileSync } from 'node:fs';
import { DataSource } from 'typeorm';
import { loadConfig } from '../config/app-config.js';
import { applyMigrations } from './apply-migrations.js';
import { openDatabaseServer } from './database-server.js';
import { typeormOptions } from './typeorm-options.js';

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

async function main(): Promise<number> {
  const [command, name] = process.argv.slice(2);
  const config = loadConfig();
  const server = await openDatabaseServer(config);
  const dataSource = new DataSource(typeormOptions(server.url, { lockTimeoutMs: 60_000 }));
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
        const pending = await dataSource.showMigrations();
        console.log(pending ? 'there are pending migrations' : 'all migrations are applied');
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
