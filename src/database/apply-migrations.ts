import type { DataSource } from 'typeorm';

// Any fixed number: every instance of this service takes the same advisory lock.
const MIGRATION_LOCK = 7_400_101;

/** Applies pending migrations; several instances starting at once take turns instead of racing. Needs a pool of 2+ connections (the lock holds one). */
export async function applyMigrations(dataSource: DataSource): Promise<string[]> {
  const runner = dataSource.createQueryRunner();
  await runner.connect();
  try {
    // Wait for another instance's migrations however long they take (the pool's lock_timeout is for requests).
    await runner.query('SET lock_timeout = 0');
    await runner.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK]);
    try {
      const applied = await dataSource.runMigrations({ transaction: 'each' });
      return applied.map((m) => m.name);
    } finally {
      await runner.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK]);
    }
  } finally {
    await runner.release();
  }
}
