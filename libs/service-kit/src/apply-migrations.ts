import { Client, type Pool } from 'pg';
import { DataSource, type DataSourceOptions, type MigrationInterface } from 'typeorm';
import type { PostgresDriver } from 'typeorm/driver/postgres/PostgresDriver.js';
import { PG, pgErrorCode } from './pg-errors.js';
import { poolerSuspicion } from './pooler-check.js';

// Any fixed number: every app of this repository (the service, the sandbox provider) takes the same advisory lock.
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
 * A DataSource that only migrates (no entities): `migrations` applied in timestamp order, each in its own transaction,
 * on one pooled connection (applyMigrations holds its lock on another).
 */
export function migrationDataSourceOptions(
  url: string,
  migrations: (new () => MigrationInterface)[],
  applicationName: string,
): DataSourceOptions {
  return {
    type: 'postgres',
    url,
    migrations,
    synchronize: false,
    migrationsRun: false,
    migrationsTransactionMode: 'each',
    uuidExtension: 'pgcrypto',
    extra: { max: 1, application_name: applicationName },
  };
}

/**
 * Applies pending migrations; several instances starting at once take turns instead of racing.
 * `migrationUrl` (DATABASE_MIGRATION_URL): a direct connection to PostgreSQL when `dataSource`
 * reaches it through a transaction pooler; the migrations and their lock then use it.
 */
export async function applyMigrations(dataSource: DataSource, migrationUrl?: string): Promise<string[]> {
  if (migrationUrl === undefined) return migrateUnderLock(dataSource, false);
  const { extra } = dataSource.options as { extra?: Record<string, unknown> };
  // Two connections: the lock holder's and the one TypeORM migrates on.
  const direct = new DataSource({ ...dataSource.options, url: migrationUrl, extra: { ...extra, max: 1 } } as DataSourceOptions);
  await direct.initialize();
  try {
    return await migrateUnderLock(direct, true);
  } finally {
    await direct.destroy();
  }
}

/**
 * The advisory lock is held on a connection of its own, outside the pool, closed afterwards: it
 * waits for another instance's migrations however long they take (no lock_timeout, no
 * statement_timeout), and those settings must never reach a pooled connection, where a request
 * would then wait on row locks without bound. A session lock, because a transaction held open
 * for it would hold back CREATE INDEX CONCURRENTLY (which waits for every older snapshot in the
 * database) forever; so it needs a direct connection: through a transaction pooler it would stay
 * behind on whichever server connection took it. Start-up refuses to take it through what looks
 * like one (see pooler-check.ts) unless DATABASE_MIGRATION_URL says where PostgreSQL itself is.
 *
 * A migration whose DDL could not get its lock within DDL_LOCK_TIMEOUT_MS was rolled back whole
 * (each runs in its own transaction); it is tried again after a pause, so traffic never waits
 * behind a DDL statement for longer than that.
 */
async function migrateUnderLock(dataSource: DataSource, direct: boolean): Promise<string[]> {
  const pool = (dataSource.driver as PostgresDriver).master as Pool;
  // The pool's own settings (URL, credentials, TLS, application_name), for one more connection.
  const lockHolder = new Client(pool.options);
  // A database restart while we hold the lock fails start-up below, instead of an unhandled 'error'.
  let lost: Error | undefined;
  lockHolder.on('error', (err) => (lost = err));
  await lockHolder.connect();
  try {
    const url = (pool.options as { connectionString?: string }).connectionString;
    if (!direct && url) {
      const { rows } = await lockHolder.query<{ port: number | null }>('SELECT inet_server_port() AS port');
      const suspicion = poolerSuspicion(url, rows[0].port, 'DATABASE_MIGRATION_URL');
      if (suspicion) throw suspicion;
    }
    await lockHolder.query('SET lock_timeout = 0');
    await lockHolder.query('SET statement_timeout = 0');
    await lockHolder.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK]);
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
    // Closing the connection releases the lock too, even when the migrations throw.
    await lockHolder.end().catch(() => undefined);
  }
}
