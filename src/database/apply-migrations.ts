import { Client, type Pool } from 'pg';
import type { DataSource, MigrationInterface } from 'typeorm';
import type { PostgresDriver } from 'typeorm/driver/postgres/PostgresDriver.js';
import { PG, pgErrorCode } from './pg-errors.js';

// Any fixed number: every instance of this service takes the same advisory lock.
const MIGRATION_LOCK = 7_400_101;

/**
 * How long a migration's DDL waits for a table lock. DDL that waits queues every request on that
 * table behind it (PostgreSQL grants locks in order), so it gives up soon and tries again later:
 * requests are held up for at most this long, within any client's patience.
 */
export const DDL_LOCK_TIMEOUT_MS = 1_000;
/** Tries of a migration whose lock stayed taken, DDL_RETRY_PAUSE_MS apart: a long transaction gets about half a minute to end. */
const DDL_ATTEMPTS = 30;
const DDL_RETRY_PAUSE_MS = 1_000;

const bounded = new WeakSet<MigrationInterface>();

/**
 * Each migration that runs in a transaction starts with SET LOCAL lock_timeout (one without a
 * transaction, CREATE INDEX CONCURRENTLY, takes no lock that blocks reads or writes).
 */
function boundLockWaits(dataSource: DataSource): void {
  for (const migration of dataSource.migrations) {
    if (migration.transaction === false || bounded.has(migration)) continue;
    const up = migration.up.bind(migration);
    migration.up = async (queryRunner) => {
      await queryRunner.query(`SET LOCAL lock_timeout = ${DDL_LOCK_TIMEOUT_MS}`);
      await up(queryRunner);
    };
    bounded.add(migration);
  }
}

/**
 * Applies pending migrations; several instances starting at once take turns instead of racing.
 *
 * The advisory lock is held by a transaction on a connection of its own, outside the pool, ended
 * afterwards: it waits for another instance's migrations however long they take (no lock_timeout,
 * no statement_timeout, for that transaction only). Transaction-scoped, so it holds through a
 * transaction pooler too (PgBouncer keeps a server connection for the whole transaction; a session
 * lock would stay behind on whichever server connection took it).
 *
 * A migration whose DDL could not get its lock within DDL_LOCK_TIMEOUT_MS was rolled back whole
 * (each runs in its own transaction); it is tried again after a pause, so traffic never waits
 * behind a DDL statement for longer than that.
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
    await lockHolder.query('BEGIN; SET LOCAL lock_timeout = 0; SET LOCAL statement_timeout = 0; SET LOCAL idle_in_transaction_session_timeout = 0');
    await lockHolder.query('SELECT pg_advisory_xact_lock($1)', [MIGRATION_LOCK]);
    boundLockWaits(dataSource);
    const applied: string[] = [];
    for (let attempt = 1; ; attempt++) {
      try {
        applied.push(...(await dataSource.runMigrations({ transaction: 'each' })).map((m) => m.name));
        break;
      } catch (err) {
        if (pgErrorCode(err) !== PG.lockNotAvailable || attempt >= DDL_ATTEMPTS) throw err;
        await new Promise((resolve) => setTimeout(resolve, DDL_RETRY_PAUSE_MS));
      }
    }
    if (lost) throw new Error('The connection holding the migration lock was lost while migrating; start again', { cause: lost });
    return applied;
  } finally {
    // Ending the transaction (or, failing that, the connection) releases the lock, even when the migrations threw.
    await lockHolder.query('COMMIT').catch(() => undefined);
    await lockHolder.end().catch(() => undefined);
  }
}
