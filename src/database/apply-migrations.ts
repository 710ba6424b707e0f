import { Client, type Pool } from 'pg';
import type { DataSource } from 'typeorm';
import type { PostgresDriver } from 'typeorm/driver/postgres/PostgresDriver.js';

// Any fixed number: every instance of this service takes the same advisory lock.
const MIGRATION_LOCK = 7_400_101;

/**
 * Applies pending migrations; several instances starting at once take turns instead of racing.
 *
 * The advisory lock is held on a connection of its own, outside the pool, closed afterwards: it
 * waits for another instance's migrations however long they take (no lock_timeout, no
 * statement_timeout), and those settings must never reach a pooled connection, where a request
 * would then wait on row locks without bound.
 */
export async function applyMigrations(dataSource: DataSource): Promise<string[]> {
  const pool = (dataSource.driver as PostgresDriver).master as Pool;
  // The pool's own settings (URL, credentials, TLS, application_name), for one more connection.
  const lockHolder = new Client(pool.options);
  // A database restart while we hold the lock fails start-up below, instead of an unhandled 'error'.
  let lost: Error | undefined;
  lockHolder.on('error', (err) => (lost = err));
  await lockHolder.connect();
  try {
    await lockHolder.query('SET lock_timeout = 0');
    await lockHolder.query('SET statement_timeout = 0');
    await lockHolder.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK]);
    // Closing the connection releases the lock too, even when the migrations throw.
    const applied = await dataSource.runMigrations({ transaction: 'each' });
    if (lost) throw new Error('The connection holding the migration lock was lost while migrating; start again', { cause: lost });
    return applied.map((m) => m.name);
  } finally {
    await lockHolder.end().catch(() => undefined);
  }
}
