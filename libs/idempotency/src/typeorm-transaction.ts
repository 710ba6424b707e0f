import type { PoolClient } from 'pg';
import type { DataSource, QueryRunner, ReplicationMode } from 'typeorm';

/** The layer's transaction has ended (COMMIT, ROLLBACK or an error): work left running from its handler cannot use it. */
export class TransactionEndedError extends Error {
  constructor() {
    super(
      'The idempotent transaction this code ran in has already ended; its connection is back in the pool. Work that outlives ' +
        'its handler (a timer, an unawaited promise, an event listener) must not write through it: await it inside the ' +
        'handler, or start it with Database.outsideTransaction().',
    );
    this.name = 'TransactionEndedError';
  }
}

/**
 * Two nested transactions (or a nested one and a statement of its parent) at once on the one connection of the claim's
 * transaction: PostgreSQL's savepoints are a stack, so rolling one back would undo the other's writes too.
 */
export class ConcurrentNestedTransactionError extends Error {
  constructor(what: string) {
    super(
      `${what} while a nested transaction is open on the idempotent transaction's connection. Inside a handler, run ` +
        'nested transactions one after another, and inside one use the EntityManager it is given.',
    );
    this.name = 'ConcurrentNestedTransactionError';
  }
}

/** The claim's transaction is READ COMMITTED; a nested transaction cannot run at another level, so asking for one is refused. */
export class IsolationLevelError extends Error {
  constructor(level: string) {
    super(
      `A nested transaction inside an idempotent handler runs in the claim's READ COMMITTED transaction; ${level} cannot be ` +
        'granted to part of a transaction. Run work that needs it outside the handler.',
    );
    this.name = 'IsolationLevelError';
  }
}

type CreateQueryRunner = (mode?: ReplicationMode) => QueryRunner;
/** QueryRunner.query without its overloads: what the wrapper forwards. */
type RunQuery = (sql: string, parameters?: unknown[], structured?: boolean) => Promise<unknown>;

/** A nested transaction opened through a runner (TypeORM's `transaction()` or `startTransaction()`): a savepoint. */
interface NestedLevel {
  runner: QueryRunner;
  savepoint: string;
}

/**
 * What a joined runner needs of the layer's open transaction. Only the innermost open nested level may send: a
 * statement from anywhere else would land inside a savepoint that is not its own.
 */
export interface JoinableTransaction {
  readonly client: PoolClient;
  /** Throws TransactionEndedError once the transaction is over. */
  assertOpen(): void;
  /** Open nested levels, innermost last. */
  readonly nested: NestedLevel[];
  /** Names savepoints, so no two in one transaction share one. */
  nextSavepoint(): string;
  /** A nested level's rollback was asked for where none is open: the whole transaction must roll back. */
  markRollbackOnly(reason: Error): void;
}

/**
 * Each attached DataSource: TypeORM's createQueryRunner bound to it (what the join calls for a runner of its own), and
 * the instance's own property as it was before (undefined: it had none, its prototype's served), for detaching.
 */
const attached = new WeakMap<DataSource, { create: CreateQueryRunner; ownBefore?: PropertyDescriptor }>();

/**
 * Replaces `createQueryRunner` on this one DataSource instance (nothing else: no prototype, no driver): every repository,
 * manager, query builder, `query()` and `transaction()` of TypeORM gets its connection there, so while `joined()` returns
 * a transaction they all run on its connection — an `@InjectRepository` repository included — and on a pooled
 * connection of their own otherwise. The how-to page says so on its first screen.
 */
export function attachTransactionJoin(dataSource: DataSource, joined: () => JoinableTransaction | undefined): void {
  if (attached.has(dataSource)) throw new Error('This DataSource is already attached to an idempotency layer');
  const ownBefore = Object.getOwnPropertyDescriptor(dataSource, 'createQueryRunner');
  const create: CreateQueryRunner = dataSource.createQueryRunner.bind(dataSource);
  attached.set(dataSource, { create, ownBefore });
  dataSource.createQueryRunner = (replication?: ReplicationMode) => {
    const open = joined();
    return open ? joinedQueryRunner(dataSource, open) : create(replication);
  };
}

/** Undoes `attachTransactionJoin` (the module's shutdown): the instance is left as it was found. */
export function detachTransactionJoin(dataSource: DataSource): void {
  const found = attached.get(dataSource);
  if (!found) return;
  attached.delete(dataSource);
  if (found.ownBefore) Object.defineProperty(dataSource, 'createQueryRunner', found.ownBefore);
  else delete (dataSource as Partial<Pick<DataSource, 'createQueryRunner'>>).createQueryRunner;
}

/** The parts of TypeORM's PostgresQueryRunner a joined runner sets (public fields, not writable in the QueryRunner interface). */
interface PostgresRunnerFields {
  databaseConnection: PoolClient;
  isTransactionActive: boolean;
}

const READ_COMMITTED = 'READ COMMITTED';

/**
 * A TypeORM QueryRunner on the open transaction's connection: one per `createQueryRunner()` call, as TypeORM expects.
 * TypeORM believes a transaction is active on it, so it never sends BEGIN; its nested transactions are savepoints with
 * names unique in the transaction, tracked as a stack so two at once are refused before anything is sent. The
 * transaction itself is the layer's: `commitTransaction()` with no nested level of this runner open is refused, and
 * `rollbackTransaction()` there marks the whole transaction rollback-only (the caller's own error stays the one thrown).
 */
export function joinedQueryRunner(dataSource: DataSource, open: JoinableTransaction): QueryRunner {
  open.assertOpen();
  const create = attached.get(dataSource)?.create ?? dataSource.createQueryRunner.bind(dataSource);
  const runner = create('master');
  const fields = runner as unknown as PostgresRunnerFields;
  fields.databaseConnection = open.client;
  fields.isTransactionActive = true;
  const own: NestedLevel[] = [];
  /** Whether this runner ever opened a nested level: a rollback asked of one that never did has nothing of its own to undo. */
  let started = false;
  const innermost = () => open.nested.at(-1);

  /** Only the innermost open level's runner may send; with none open, any runner of the transaction. */
  const assertMayUse = (what: string) => {
    open.assertOpen();
    const top = innermost();
    if (top && top.runner !== runner) throw new ConcurrentNestedTransactionError(what);
  };

  const query = runner.query.bind(runner) as RunQuery;
  runner.query = (async (sql: string, parameters?: unknown[], structured?: boolean) => {
    assertMayUse('A statement was sent');
    return query(sql, parameters, structured);
  }) as QueryRunner['query'];
  const stream = runner.stream.bind(runner);
  runner.stream = (...args: Parameters<QueryRunner['stream']>) => {
    assertMayUse('A stream was opened');
    return stream(...args);
  };

  runner.startTransaction = async (isolationLevel) => {
    const level = isolationLevel ?? (runner.connection.options as { isolationLevel?: string }).isolationLevel;
    if (level !== undefined && level !== READ_COMMITTED) throw new IsolationLevelError(level);
    assertMayUse('Another nested transaction was started');
    const nested = { runner, savepoint: open.nextSavepoint() };
    // On the stack before the SAVEPOINT is sent: a second one started meanwhile is refused, not interleaved.
    open.nested.push(nested);
    own.push(nested);
    started = true;
    try {
      await query(`SAVEPOINT ${nested.savepoint}`);
    } catch (err) {
      open.nested.pop();
      own.pop();
      throw err;
    }
  };
  runner.commitTransaction = async () => {
    const nested = own.at(-1);
    if (!nested) throw new Error('commitTransaction() would end the idempotent transaction: the layer commits it with the stored answer');
    if (innermost() !== nested) throw new ConcurrentNestedTransactionError('A nested transaction was committed');
    open.assertOpen();
    await query(`RELEASE SAVEPOINT ${nested.savepoint}`);
    open.nested.pop();
    own.pop();
  };
  runner.rollbackTransaction = async () => {
    const nested = own.at(-1);
    if (!nested) {
      // Refused at its start (TypeORM's transaction() rolls back in its catch): nothing of it was sent.
      if (!started) return;
      // After its own commit: TypeORM's recipe rolls back in its catch, then rethrows its error, which stays the one seen.
      open.markRollbackOnly(new Error('rollbackTransaction() was called on the idempotent transaction: it was rolled back whole'));
      return;
    }
    if (innermost() !== nested) throw new ConcurrentNestedTransactionError('A nested transaction was rolled back');
    open.nested.pop();
    own.pop();
    open.assertOpen();
    await query(`ROLLBACK TO SAVEPOINT ${nested.savepoint}`);
    await query(`RELEASE SAVEPOINT ${nested.savepoint}`);
  };
  // The connection is the layer's: it commits, rolls back and releases it.
  runner.release = () => Promise.resolve();
  return runner;
}
