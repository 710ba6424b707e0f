import { DataSource } from 'typeorm';
import { Fulfilment1764000000000 } from '../migrations/1764000000000-fulfilment.js';

export const FULFILMENT_MIGRATIONS = [Fulfilment1764000000000];

/**
 * Applies this app's migrations (its own history table) under a session advisory lock, so that instances starting
 * together apply them once, one after the other. Returns the names applied.
 */
export async function migrateFulfilment(databaseUrl: string): Promise<string[]> {
  const dataSource = new DataSource({
    type: 'postgres',
    url: databaseUrl,
    migrations: FULFILMENT_MIGRATIONS,
    migrationsTableName: 'fulfilment_migrations',
    migrationsTransactionMode: 'each',
    extra: { max: 2 },
  });
  await dataSource.initialize();
  const lock = dataSource.createQueryRunner();
  try {
    await lock.connect();
    await lock.query(`SELECT pg_advisory_lock(hashtext('fulfilment migrations'))`);
    const applied = await dataSource.runMigrations({ transaction: 'each' });
    return applied.map((m) => m.name);
  } finally {
    await lock.query(`SELECT pg_advisory_unlock(hashtext('fulfilment migrations'))`).catch(() => undefined);
    await lock.release();
    await dataSource.destroy();
  }
}
