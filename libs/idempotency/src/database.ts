import { Inject, Injectable, Logger, type OnModuleDestroy } from '@nestjs/common';
import { AsyncLocalStorage } from 'node:async_hooks';
import type { Pool, PoolClient, QueryConfig, QueryResult } from 'pg';
import { DataSource, type EntityManager, type EntityTarget, type ObjectLiteral, type Repository } from 'typeorm';
import type { PostgresDriver } from 'typeorm/driver/postgres/PostgresDriver.js';
import { IDEMPOTENCY_OPTIONS, type ResolvedIdempotencyOptions } from './idempotency-options.js';
import { monotonicNow } from './monotonic-clock.js';
import { DatabaseNotAnsweringError, isCachedPlanInvalidated, isDatabaseUnavailable } from './pg-errors.js';
import {
  attachTransactionJoin,
  ConcurrentNestedTransactionError,
  detachTransactionJoin,
  type JoinableTransaction,
  joinedQueryRunner,
  TransactionEndedError,
} from './typeorm-transaction.js';

/**
 * How many distinct statement texts get a name (a server-side prepared statement on each connection that runs them).
 * Our SQL is a few dozen constant texts; the cap only bounds the map should some caller build texts from values.
 */
const MAX_NAMED_STATEMENTS = 500;

/**
 * Statement text → its name, for the whole process: a name never stands for two texts, whichever connection runs it.
 * A named statement is parsed and planned once per connection, then only bound and executed (pg's public `name`).
 */
const statementNames = new Map<string, string>();

/** Statements with parameters get a name. One without may hold several commands, which only the simple protocol accepts. */
function namedStatement(text: string, values: unknown[]): string | QueryConfig {
  if (values.length === 0) return text;
  let name = statementNames.get(text);
  if (name === undefined) {
    if (statementNames.size >= MAX_NAMED_STATEMENTS) return { text, values };
    name = `s${statementNames.size + 1}`;
    statementNames.set(text, name);
  }
  return { name, text, values };
}

/** Unnamed: parsed on every run, so no state is left on the server connection (what a transaction pooler needs). */
function unnamedStatement(text: string, values: unknown[]): string | QueryConfig {
  return values.length === 0 ? text : { text, values };
}

/**
 * What every transaction of the service runs under. They ride with each transaction (SET LOCAL, in the same message
 * as BEGIN) rather than with the session: through a transaction pooler a session is shared by whoever runs next, and
 * PgBouncer refuses them as startup `options`.
 */
export interface TransactionSettings {
  /** Bounds every lock wait; a request that would wait longer fails fast with 55P03 and is told to retry. */
  lockTimeoutMs: number;
  statementTimeoutMs: number;
  idleInTransactionTimeoutMs: number;
  /** Named (server-side prepared) statements: off behind a pooler that cannot keep them. */
  preparedStatements: boolean;
}

export function transactionSettings(options: Pick<ResolvedIdempotencyOptions, 'waitMs' | 'preparedStatements'>): TransactionSettings {
  return {
    // lock_timeout 0 would mean "wait forever": a zero wait is the shortest one PostgreSQL can do.
    lockTimeoutMs: Math.max(options.waitMs, 1),
    // 30 s: far past any request's own budget; only a runaway statement reaches it.
    statementTimeoutMs: 30_000,
    // 60 s: a transaction left open by a stuck process stops holding its row locks.
    idleInTransactionTimeoutMs: 60_000,
    preparedStatements: options.preparedStatements,
  };
}

/** BEGIN and the settings: one simple-protocol message (several commands, no parameters), one round trip. */
function beginStatement(settings: TransactionSettings): string {
  return [
    'BEGIN ISOLATION LEVEL READ COMMITTED',
    `SET LOCAL lock_timeout = ${Math.trunc(settings.lockTimeoutMs)}`,
    `SET LOCAL statement_timeout = ${Math.trunc(settings.statementTimeoutMs)}`,
    `SET LOCAL idle_in_transaction_session_timeout = ${Math.trunc(settings.idleInTransactionTimeoutMs)}`,
  ].join('; ');
}

/** Every pooled connection stayed busy for the pool's `connectionTimeoutMillis`: the app is overloaded, retry shortly. */
export class PoolExhaustedError extends Error {
  constructor(options?: ErrorOptions) {
    super('No database connection became free in time', options);
    this.name = 'PoolExhaustedError';
  }
}

/**
 * PostgreSQL answered the COMMIT with ROLLBACK: a statement of the transaction had failed (its error caught and
 * ignored by the code that ran it), so nothing of it was kept. Never a stored answer, never an acknowledged message.
 */
export class TransactionRolledBackError extends Error {
  constructor(reason: string, options?: ErrorOptions) {
    super(`The transaction was rolled back, not committed: ${reason}`, options);
    this.name = 'TransactionRolledBackError';
  }
}

/** One transaction of `Database.transaction(fn)`: its connection and where it stands. */
class OpenTransaction implements JoinableTransaction {
  /** 'open' until COMMIT or ROLLBACK is about to be sent; then nothing more may be sent from its context. */
  private state: 'open' | 'ended' = 'open';
  readonly nested: JoinableTransaction['nested'] = [];
  /** Statements sent after BEGIN: a 0A000 on the first one can be retried on a fresh connection (see `Database.send`). */
  statementsSent = 0;
  /** TypeORM runners made on this connection: while there are none, the connection can still be swapped. */
  runnersMade = 0;
  rollbackOnly?: Error;
  private savepoints = 0;
  /** False once `client` is handed back to the pool: nothing may be sent on it or release it again. */
  private holding = true;
  /** Why the transaction holds no connection: a fresh one could not be had after the old one was dropped. */
  private lostWith?: Error;

  constructor(public client: PoolClient) {}

  get holdsConnection(): boolean {
    return this.holding;
  }

  get lostConnection(): Error | undefined {
    return this.lostWith;
  }

  /** The connection was released, and a fresh one could not be had: nothing more can run in this transaction. */
  connectionLost(err: Error): void {
    this.lostWith = err;
  }

  /** Hands the connection back to the pool, dropped when `broken` is given. Once only. */
  releaseConnection(broken?: Error): void {
    if (!this.holding) return;
    this.holding = false;
    this.client.release(broken);
  }

  /** A fresh connection in place of the one released. */
  takeConnection(client: PoolClient): void {
    this.client = client;
    this.holding = true;
  }

  assertOpen(): void {
    if (this.state === 'ended') throw new TransactionEndedError();
    // `fn` caught the failed connect and went on: what it sends next has no connection to go to.
    if (this.lostWith) throw this.lostWith;
  }

  end(): void {
    this.state = 'ended';
  }

  get ended(): boolean {
    return this.state === 'ended';
  }

  nextSavepoint(): string {
    return `typeorm_nested_${++this.savepoints}`;
  }

  markRollbackOnly(reason: Error): void {
    this.rollbackOnly ??= reason;
  }
}

/**
 * The transaction the layer carries. `transaction(fn)` opens one (BEGIN at once, with the settings) and every `query`,
 * and every TypeORM repository, manager, `query()` and `transaction()` of the DataSource used while `fn` runs — in any
 * service of the app — joins it, so an interceptor can claim an idempotency key, let the handler write, and record the
 * response in ONE commit. A `query` outside one is a transaction of its own.
 *
 * Its lifecycle is explicit: when `fn` settles the transaction ends — COMMIT (whose answer is checked: PostgreSQL turns
 * the COMMIT of a failed transaction into a ROLLBACK) or ROLLBACK — and from then on any use from its async context (a
 * timer or an unawaited promise `fn` left behind) throws TransactionEndedError. Nothing is ever sent on a connection the
 * layer has handed back. Every statement is sent where it is written and awaited; nothing is queued for later.
 *
 * It uses TypeORM's own `pg` pool and public pg API only. The one thing it attaches to the DataSource it is given is its
 * `createQueryRunner` (see typeorm-transaction.ts): `attach()` does it, and the module calls it once at start-up.
 *
 * A database restart must not take the process down: pg emits 'error' on a checked-out client whose server goes away
 * between two queries, and pg-pool listens only while the client is idle. So every client this class checks out gets
 * a listener of its own, and a client whose connection broke is released with the error, so the pool drops it.
 */
@Injectable()
export class Database implements OnModuleDestroy {
  private readonly logger = new Logger('Database');
  /** monotonicNow() when a transaction last ended with its connection back in the pool: the database was answering. */
  private lastAnsweredAt = 0;
  /** monotonicNow() when a transaction or a connect last failed because the database could not be reached. */
  private lastUnreachableAt = 0;
  private readonly current = new AsyncLocalStorage<OpenTransaction>();
  /** Clients that already carry our 'error' listener: pg reuses clients, and one listener each is enough. */
  private readonly guarded = new WeakSet<PoolClient>();
  private readonly onClientError = (err: Error) =>
    this.logger.warn(`a database connection in use failed; it is dropped when released: ${err.message}`);
  private readonly settings: TransactionSettings;
  private readonly begin: string;
  private readonly statement: (text: string, values: unknown[]) => string | QueryConfig;

  constructor(
    private readonly dataSource: DataSource,
    @Inject(IDEMPOTENCY_OPTIONS) options: ResolvedIdempotencyOptions,
  ) {
    this.settings = transactionSettings(options);
    this.begin = beginStatement(this.settings);
    this.statement = this.settings.preparedStatements ? namedStatement : unnamedStatement;
  }

  /**
   * Makes the DataSource's repositories, manager, `query()` and `transaction()` join the transaction open in their
   * async context (by replacing `createQueryRunner` on this DataSource instance). Called once, by the module.
   */
  attach(): this {
    attachTransactionJoin(this.dataSource, () => {
      const open = this.current.getStore();
      if (open) open.runnersMade++;
      return open;
    });
    return this;
  }

  onModuleDestroy(): void {
    detachTransactionJoin(this.dataSource);
  }

  /**
   * TypeORM in the current transaction: repositories and query builders of this manager run on the transaction's
   * connection, between the claim and the recorded answer, and commit (or roll back) with them. Outside a transaction,
   * the DataSource's own manager.
   */
  get manager(): EntityManager {
    const open = this.current.getStore();
    if (!open) return this.dataSource.manager;
    open.runnersMade++;
    return joinedQueryRunner(this.dataSource, open).manager;
  }

  /** `manager.getRepository(target)`: the entity's repository in the current transaction. */
  getRepository<Entity extends ObjectLiteral>(target: EntityTarget<Entity>): Repository<Entity> {
    return this.manager.getRepository(target);
  }

  private get pool(): Pool {
    return (this.dataSource.driver as PostgresDriver).master as Pool;
  }

  /** The rows the statement returned (RETURNING rows for INSERT/UPDATE/DELETE), in the current transaction or one of its own. */
  async query<T>(sql: string, params: unknown[] = []): Promise<T[]> {
    const open = this.current.getStore();
    if (!open) return this.transaction(() => this.query<T>(sql, params));
    return (await this.send(open, sql, params)).rows as T[];
  }

  /** A point the current transaction can return to. */
  async savepoint(name: string): Promise<void> {
    await this.query(`SAVEPOINT ${name}`);
  }

  /** Undoes everything since `savepoint(name)`; the savepoint stays, to be rolled back to again. */
  async rollbackToSavepoint(name: string): Promise<void> {
    await this.query(`ROLLBACK TO SAVEPOINT ${name}`);
  }

  /** Bounds the current transaction's lock waits from its next statement on; without `ms`, back to the service's lock_timeout. */
  async setLockTimeout(ms?: number): Promise<void> {
    // lock_timeout 0 means "no limit": one millisecond is the shortest wait PostgreSQL can do.
    await this.query(`SELECT set_config('lock_timeout', $1, true)`, [`${Math.max(1, Math.ceil(ms ?? this.settings.lockTimeoutMs))}ms`]);
  }

  /**
   * Sends one statement on the open transaction's connection. A 0A000 ("cached plan must not change result type": a
   * schema change altered the result of a named statement this connection prepared) on the transaction's FIRST
   * statement is retried on a fresh connection: nothing was done yet and nobody saw a result, so the retry is as if the
   * first try never happened. The failed connection is dropped, and its stale statements with it. Later, the error
   * propagates (answered 503, retryable).
   */
  private async send(open: OpenTransaction, sql: string, params: unknown[]): Promise<QueryResult> {
    open.assertOpen();
    if (open.nested.length > 0) throw new ConcurrentNestedTransactionError('A statement of the enclosing transaction was sent');
    const first = open.statementsSent++ === 0;
    try {
      return await open.client.query(this.statement(sql, params), params);
    } catch (err) {
      // Alone on the wire: no statement went out behind it while it failed, and no TypeORM runner holds this connection.
      const nothingDependsOnIt = first && open.statementsSent === 1 && open.runnersMade === 0;
      if (!(nothingDependsOnIt && isCachedPlanInvalidated(err))) throw err;
      this.logger.warn(`a schema change invalidated a prepared statement (${(err as Error).message}); this connection is dropped`);
      await open.client.query('ROLLBACK').catch(() => undefined);
      // Released before the fresh one is taken (with a pool of one it would wait for itself); if that connect fails,
      // the transaction ends holding no connection, and nothing is sent on or releases the old one again.
      open.releaseConnection(err as Error);
      open.takeConnection(
        await this.connect().catch((connectError: unknown) => {
          open.connectionLost(connectError instanceof Error ? connectError : new Error(String(connectError)));
          throw connectError;
        }),
      );
      await open.client.query(this.begin);
      return await open.client.query(this.statement(sql, params), params);
    }
  }

  /**
   * A pooled connection, or PoolExhaustedError once the pool's `connectionTimeoutMillis` has passed without one
   * (DatabaseNotAnsweringError when the database was last found unreachable and nothing ended well since).
   * With the server down, this fails at once (ECONNREFUSED): no retry here, the client is told 503.
   */
  private async connect(): Promise<PoolClient> {
    let client: PoolClient;
    try {
      client = await this.pool.connect();
    } catch (err) {
      // pg-pool's words for its connectionTimeoutMillis; anything else is a real connection failure.
      if (err instanceof Error && err.message === 'timeout exceeded when trying to connect') {
        // Overloaded, unless the last news of the database is that it could not be reached and nothing ended well since
        // (a restart behind a pooler: the pooler holds every statement until the server is back).
        if (this.lastUnreachableAt > this.lastAnsweredAt) throw new DatabaseNotAnsweringError({ cause: err });
        throw new PoolExhaustedError({ cause: err });
      }
      if (isDatabaseUnavailable(err)) this.lastUnreachableAt = monotonicNow();
      throw err;
    }
    if (!this.guarded.has(client)) {
      client.on('error', this.onClientError);
      this.guarded.add(client);
    }
    return client;
  }

  /**
   * Runs `fn` as if no transaction were open: its statements and transactions use connections of their own.
   * For work that must commit on its own before the caller's transaction goes on (settling a stale operation
   * before the caller locks the rows it needs), or that outlives the caller (a background task it starts).
   */
  outsideTransaction<T>(fn: () => Promise<T>): Promise<T> {
    return this.current.exit(fn);
  }

  /**
   * Runs `fn` in a transaction (READ COMMITTED), or in the one already open. Commits when it resolves — and throws
   * TransactionRolledBackError when PostgreSQL answers that COMMIT with ROLLBACK — and rolls back when it throws.
   */
  async transaction<T>(fn: () => Promise<T>): Promise<T> {
    const outer = this.current.getStore();
    if (outer) {
      outer.assertOpen();
      return fn();
    }
    const open = new OpenTransaction(await this.connect());
    let broken: Error | undefined;
    try {
      await open.client.query(this.begin);
      let result: T;
      try {
        result = await this.current.run(open, fn);
      } catch (err) {
        open.end();
        // A ROLLBACK that fails too (the connection is gone) must not hide why `fn` failed.
        if (open.holdsConnection) {
          await open.client.query('ROLLBACK').catch((rollbackError: unknown) => {
            broken = rollbackError instanceof Error ? rollbackError : new Error('ROLLBACK failed', { cause: rollbackError });
          });
        }
        throw err;
      }
      await this.commit(open);
      return result;
    } catch (err) {
      // A connection that failed, or whose transaction could not be ended, is dropped, not handed to the next request.
      const unreachable = isDatabaseUnavailable(err);
      if (unreachable) this.lastUnreachableAt = monotonicNow();
      if (unreachable || (open.holdsConnection && open.client.getTransactionStatus() !== 'I'))
        broken ??= err instanceof Error ? err : new Error(String(err));
      throw err;
    } finally {
      open.end();
      if (open.holdsConnection) {
        open.releaseConnection(broken);
        if (!broken) this.lastAnsweredAt = monotonicNow();
      }
    }
  }

  /** COMMIT, and its answer checked: an aborted transaction's COMMIT is answered ROLLBACK, with no error. */
  private async commit(open: OpenTransaction): Promise<void> {
    const refusal =
      open.rollbackOnly ??
      (open.nested.length > 0 ? new Error('a nested transaction was left open (started, never committed)') : undefined);
    // Ended before COMMIT goes out: a statement sent from the context now would run after it, on its own.
    open.end();
    // `fn` caught the failed connect of a retry and returned: there is no connection to commit on, and nothing to commit.
    if (!open.holdsConnection)
      throw new TransactionRolledBackError('its connection was dropped and a fresh one could not be had', { cause: open.lostConnection });
    if (refusal) {
      await open.client.query('ROLLBACK');
      throw new TransactionRolledBackError(refusal.message, { cause: refusal });
    }
    const answer = await open.client.query('COMMIT');
    if (answer.command !== 'COMMIT') {
      throw new TransactionRolledBackError(
        'PostgreSQL answered the COMMIT with ROLLBACK because a statement in it had failed (an error caught and not rethrown)',
      );
    }
  }
}
