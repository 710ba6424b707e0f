import { Logger } from '@nestjs/common';
import pg, { type PoolClient } from 'pg';
import type { DataSource, QueryRunner, ReplicationMode } from 'typeorm';
import type { EscapingWrites } from './idempotency-options.js';

/**
 * A write sent on a connection that cannot join the open idempotent transaction (a second DataSource, a raw `pg`
 * pool): it would commit on its own, whatever the transaction then does, so a retry would repeat it.
 */
export class EscapingWriteError extends Error {
  constructor(sql: string) {
    super(
      `A write on a database connection outside the open idempotent transaction would commit on its own ` +
        `(${sql.trim().slice(0, 60)}…). Inside an @Idempotent() handler, write through the DataSource the layer uses ` +
        `(its repositories, manager, query() or transaction()), which join the transaction, not through another DataSource or pg pool.`,
    );
    this.name = 'EscapingWriteError';
  }
}

/** What cannot change anything: the only statements allowed on another connection while a transaction is open. */
const READS = /^\s*(select|show|explain)\b/i;

type CreateQueryRunner = (mode?: ReplicationMode) => QueryRunner;
/** QueryRunner.query without its overloads: what the wrappers forward. */
type RunQuery = (sql: string, parameters?: unknown[], structured?: boolean) => Promise<unknown>;

/** Each DataSource's own createQueryRunner, before the join wrapped it: the joined runner is made with it. */
const unjoined = new WeakMap<DataSource, CreateQueryRunner>();

/**
 * Every repository, manager, query builder, `query()` and `transaction()` of TypeORM gets its connection from
 * `dataSource.createQueryRunner()`: wrapping that one method of this DataSource (not TypeORM's prototypes) makes all
 * of them — an `@InjectRepository` repository included — run on the open transaction's runner while there is one
 * (`joined()` returns it), and on a pooled connection of their own otherwise.
 */
export function joinOpenTransactions(dataSource: DataSource, joined: () => QueryRunner | undefined): void {
  if (unjoined.has(dataSource)) return;
  const create: CreateQueryRunner = dataSource.createQueryRunner.bind(dataSource);
  unjoined.set(dataSource, create);
  dataSource.createQueryRunner = (replication?: ReplicationMode) => joined() ?? create(replication);
}

/** The parts of TypeORM's PostgresQueryRunner a joined runner sets (public fields, not in the QueryRunner interface as writable). */
interface PostgresRunnerFields {
  databaseConnection: PoolClient;
  isTransactionActive: boolean;
  transactionDepth: number;
  isReleased: boolean;
}

/**
 * A TypeORM QueryRunner on the open transaction's own connection, so everything that uses it writes inside it.
 * TypeORM uses a connection a runner already holds as it is, and a transaction it believes open (depth 1) gets
 * SAVEPOINTs for a nested `transaction()` instead of a second BEGIN. Each statement first sends what the layer has
 * queued (BEGIN, a SAVEPOINT), in order on the same connection. The transaction itself is the layer's: committing or
 * rolling it back from TypeORM is refused, and `close()` ends the runner with it, so a manager kept past it throws
 * instead of writing outside it.
 */
export function joinedQueryRunner(
  dataSource: DataSource,
  client: PoolClient,
  flush: () => Promise<unknown> | undefined,
): { runner: QueryRunner; close: () => void } {
  const create = unjoined.get(dataSource) ?? dataSource.createQueryRunner.bind(dataSource);
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
  // At depth 1 TypeORM would send COMMIT or ROLLBACK: the claim, the handler's writes and the answer commit together or not at all.
  for (const end of ['commitTransaction', 'rollbackTransaction'] as const) {
    const own = runner[end].bind(runner);
    runner[end] = () => {
      if (fields.transactionDepth <= 1)
        return Promise.reject(new Error(`${end}() would end the idempotent transaction: the layer ends it`));
      return own();
    };
  }
  // The connection is the layer's: it commits, rolls back and releases it.
  runner.release = () => Promise.resolve();
  return { runner, close: () => (fields.isReleased = true) };
}

/** What `refuseEscapingWrites` asks each open layer: the connection of the transaction open in this async context, if any. */
export interface TransactionScope {
  openClient(): PoolClient | undefined;
  escapingWrites: EscapingWrites;
}

const scopes = new Set<TransactionScope>();
let refusing = false;

/**
 * Refuses (or, opted in, logs) any statement but a read sent on a connection other than the open transaction's, in
 * the async context of that transaction: the writes that cannot join it (a second DataSource, a raw `pg` pool). It
 * wraps `pg.Client.prototype.query` once, when the first layer starts (nothing happens on import): a connection of
 * `pg` is the one place every such write passes. Returns what removes this layer's scope again.
 */
export function refuseEscapingWrites(scope: TransactionScope): () => void {
  scopes.add(scope);
  if (!refusing) {
    refusing = true;
    const logger = new Logger('Idempotency');
    const prototype = pg.Client.prototype as unknown as { query: (this: PoolClient, ...args: unknown[]) => unknown };
    const query = prototype.query;
    prototype.query = function guardedQuery(this: PoolClient, ...args: unknown[]) {
      // Checked per statement, cheapest first: most run with no transaction open, or on the open one's own connection.
      for (const open of scopes) {
        const client = open.openClient();
        if (client === undefined || client === this) continue;
        const [config] = args;
        const sql = typeof config === 'string' ? config : (config as { text?: unknown } | undefined)?.text;
        if (typeof sql !== 'string' || READS.test(sql)) continue;
        const escaping = new EscapingWriteError(sql);
        if (open.escapingWrites === 'log') {
          logger.error(escaping.message);
          continue;
        }
        const callback = args.find((arg) => typeof arg === 'function') as ((err: Error) => void) | undefined;
        if (callback) return void process.nextTick(callback, escaping);
        return Promise.reject(escaping);
      }
      return query.apply(this, args);
    };
  }
  return () => scopes.delete(scope);
}
