import { Logger } from '@nestjs/common';
import type { PoolClient } from 'pg';
import type { DataSource, QueryRunner, ReplicationMode } from 'typeorm';
import type { EscapingWrites } from './idempotency-options.js';

/**
 * A write sent on another connection while a transaction of the layer is open: it would commit on
 * its own, whatever the transaction then does, so a retry would repeat it. Thrown where the write
 * is made, in development and tests (`escapingWrites: 'refuse'`).
 */
export class EscapingWriteError extends Error {
  constructor(sql: string) {
    super(
      `A write on another database connection while an idempotent transaction is open would commit outside it ` +
        `(${sql.trim().slice(0, 60)}…). Use Database.manager or Database.getRepository(Entity) inside @Idempotent() handlers, ` +
        `not an injected repository or the DataSource's manager (docs/use-it-in-your-app.md).`,
    );
    this.name = 'EscapingWriteError';
  }
}

/** What cannot change anything: the only statements allowed on another connection while a transaction is open. */
const READS = /^\s*(select|show|explain)\b/i;

type CreateQueryRunner = (mode?: ReplicationMode) => QueryRunner;
/** QueryRunner.query without its overloads: what the wrappers forward. */
type RunQuery = (sql: string, parameters?: unknown[], structured?: boolean) => Promise<unknown>;

/** Each DataSource's own createQueryRunner, before the guard wrapped it: the joined runner is made with it. */
const unguarded = new WeakMap<DataSource, CreateQueryRunner>();

/**
 * Every repository, manager, query builder and `DataSource.query` of TypeORM gets its connection from
 * `dataSource.createQueryRunner()`: wrapping that one method of this DataSource (not TypeORM's
 * prototypes; nothing happens on import) sees every statement that would go out on a connection of
 * its own. While `isOpen()` (a transaction of Database is open in this async context), any statement
 * but a read is refused, or logged at error in 'log' mode.
 */
export function guardEscapingWrites(dataSource: DataSource, isOpen: () => boolean, mode: EscapingWrites): void {
  if (unguarded.has(dataSource)) return;
  const create: CreateQueryRunner = dataSource.createQueryRunner.bind(dataSource);
  unguarded.set(dataSource, create);
  const logger = new Logger('Idempotency');
  dataSource.createQueryRunner = (replication?: ReplicationMode) => {
    const runner = create(replication);
    const query = runner.query.bind(runner) as RunQuery;
    runner.query = ((sql: string, parameters?: unknown[], structured?: boolean) => {
      if (isOpen() && !READS.test(sql)) {
        const escaping = new EscapingWriteError(sql);
        if (mode === 'refuse') return Promise.reject(escaping);
        logger.error({ err: escaping }, 'a write escaped the idempotent transaction');
      }
      return query(sql, parameters, structured);
    }) as QueryRunner['query'];
    return runner;
  };
}

/** The parts of TypeORM's PostgresQueryRunner a joined runner sets (public fields, not in the QueryRunner interface as writable). */
interface PostgresRunnerFields {
  databaseConnection: PoolClient;
  isTransactionActive: boolean;
  transactionDepth: number;
  isReleased: boolean;
}

/**
 * A TypeORM QueryRunner on the open transaction's own connection, so `runner.manager` writes inside it.
 * TypeORM uses a connection a runner already holds as it is, and a transaction it believes open gets
 * SAVEPOINTs for a nested `manager.transaction()` instead of a second BEGIN. Each statement first
 * sends what Database has queued (BEGIN, a SAVEPOINT), in order on the same connection. `close()`
 * ends it with the transaction: a manager kept past it then throws instead of writing outside it.
 */
export function joinedQueryRunner(dataSource: DataSource, client: PoolClient, flush: () => Promise<unknown> | undefined): { runner: QueryRunner; close: () => void } {
  const create = unguarded.get(dataSource) ?? dataSource.createQueryRunner.bind(dataSource);
  const runner = create('master');
  const fields = runner as unknown as PostgresRunnerFields;
  fields.databaseConnection = client;
  fields.isTransactionActive = true;
  fields.transactionDepth = 1;
  const query = runner.query.bind(runner) as RunQuery;
  runner.query = ((sql: string, parameters?: unknown[], structured?: boolean) => {
    // Queued on the connection before TypeORM's statement (pg sends a client's queries in order).
    const queued = flush();
    const result = query(sql, parameters, structured);
    if (!queued) return result;
    return Promise.allSettled([queued, result]).then(([sent, answered]) => {
      if (sent.status === 'rejected') throw sent.reason;
      if (answered.status === 'rejected') throw answered.reason;
      return answered.value;
    });
  }) as QueryRunner['query'];
  // The connection is Database's: it commits, rolls back and releases it.
  runner.release = () => Promise.resolve();
  return { runner, close: () => (fields.isReleased = true) };
}
