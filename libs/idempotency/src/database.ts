import { Inject, Injectable, Logger, type OnModuleDestroy } from '@nestjs/common';
import { AsyncLocalStorage } from 'node:async_hooks';
import type { Pool, PoolClient, QueryConfig } from 'pg';
import { DataSource, type EntityManager, type EntityTarget, type ObjectLiteral, type QueryRunner, type Repository } from 'typeorm';
import type { PostgresDriver } from 'typeorm/driver/postgres/PostgresDriver.js';
import { IDEMPOTENCY_OPTIONS, type ResolvedIdempotencyOptions } from './idempotency-options.js';
import { isCachedPlanInvalidated, isDatabaseUnavailable } from './pg-errors.js';
import { joinedQueryRunner, joinOpenTransactions, refuseEscapingWrites } from './typeorm-transaction.js';

/**
 * How many distinct statement texts get a name (a server-side prepared statement on each
 * connection that runs them). Our SQL is a few dozen constant texts; the cap only bounds the map
 * (and each connection's statement cache) should some caller build texts from values.
 */
const MAX_NAMED_STATEMENTS = 500;

/**
 * Statement text → its name, for the whole process: a name never stands for two texts, whichever
 * pool or connection runs it. A named statement is parsed and planned once per connection, then
 * only bound and executed: the hot path's statements are the same few texts every request, and
 * parsing them again each time costs PostgreSQL CPU.
 * PostgreSQL re-plans a prepared statement when the schema under it changes, but it refuses one whose
 * result columns changed (0A000): every statement names its columns, and `Database` recovers a 0A000
 * (see `send`) for a schema change a statement still depends on.
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

/** Drops every prepared statement of the connection: after a 0A000, each is parsed afresh on its next use. */
const DISCARD_STATEMENTS = 'DEALLOCATE ALL';

/**
 * What every transaction of the service runs under. They ride with each transaction (SET LOCAL, in
 * the same message as BEGIN) rather than with the session: through a transaction pooler a session
 * is shared by whoever runs next, and PgBouncer refuses them as startup `options`.
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

/** BEGIN and the settings, one simple-protocol message (several commands, no parameters): no round trip of their own. */
function beginStatement(settings: TransactionSettings): string {
  return [
    'BEGIN',
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

/** A statement whose rows nobody reads: it rides along with the next one that is sent. */
interface Deferred {
  sql: string;
  params: unknown[];
}

/**
 * Where a transaction stands on its connection. 'not begun': BEGIN is not sent yet — a transaction that makes no query
 * costs no round trip at all — or the last one ended (COMMIT, or ROLLBACK after a 0A000). 'begun': BEGIN went out
 * (in the first batch, `takeDeferred`) and neither COMMIT nor ROLLBACK has since.
 */
type TransactionState = 'not begun' | 'begun';

/** The transaction `transaction(fn)` opened, as every query made while `fn` runs finds it. */
interface OpenTransaction {
  client: PoolClient;
  state: TransactionState;
  /** Batches sent so far: only the first, alone on the wire, can simply be sent again (see `send`). */
  sent: number;
  /** Sent, in order, in the same write as the next statement (or the COMMIT). */
  deferred: Deferred[];
  /** TypeORM's view of this transaction, made on its first use (see typeorm-transaction.ts). */
  runner?: QueryRunner;
  /** Ends TypeORM's view when the transaction ends: a manager kept past it fails loudly instead of writing outside it. */
  closeRunner?: () => void;
}

const COMMIT: Deferred = { sql: 'COMMIT', params: [] };

/**
 * The current transaction. `transaction(fn)` opens one and every `query`, and every repository of
 * `manager`, used while `fn` runs — in any service of the app — joins it, so an interceptor can
 * claim an idempotency key, let the handler write, and record the response in ONE commit. A `query`
 * outside one is a transaction of its own (BEGIN, the statement and COMMIT in one write). The DataSource's own
 * repositories (`@InjectRepository`), manager, `query()` and `transaction()` join it too; a write on any other
 * connection while one is open (a second DataSource, a raw `pg` pool) would commit on its own, outside it: it is
 * refused (see typeorm-transaction.ts).
 *
 * Round trips are the cost that matters on a small machine (each is a write to the socket and a
 * wake-up of a PostgreSQL backend), so a transaction sends what it can together, over a pipelined
 * connection (pg's `pipeline` mode: each statement keeps its own result and error):
 * - BEGIN, with the transaction's settings (SET LOCAL), goes out with the transaction's first statement;
 * - `defer(sql)` queues a statement whose result nobody reads (a SAVEPOINT, recording a response):
 *   it goes out with the next statement, or with the COMMIT;
 * so an idempotent create is three round trips: BEGIN + claim, SAVEPOINT + insert, record + COMMIT.
 * The order of statements, and so every guarantee, is exactly that of sending them one by one; a
 * batch's first error is the one thrown (the statements after it fail only because it aborted the
 * transaction). Nothing is left on a server connection between transactions, so a transaction
 * pooler (PgBouncer in transaction mode) can hand it to another client: with named statements off
 * (`preparedStatements: false`), not even a prepared statement.
 *
 * It talks to TypeORM's own `pg` pool directly and carries the transaction itself: hand-written SQL
 * through TypeORM's QueryRunner costs a round trip per statement, and @nestjs-cls/transactional,
 * which would carry it too, is CommonJS that require()s the ESM-only Nest 12 (Jest cannot load it on Node 20).
 *
 * A database restart must not take the process down: pg emits 'error' on a checked-out client
 * whose server goes away between two queries, and pg-pool listens only while the client is idle
 * (TypeORM's pool handler then logs it). So every client this class checks out gets a listener of
 * its own, and a client whose connection broke is released with the error, so the pool drops it.
 */
@Injectable()
export class Database implements OnModuleDestroy {
  private readonly logger = new Logger('Database');
  private readonly current = new AsyncLocalStorage<OpenTransaction>();
  /** Clients that already carry our 'error' listener: pg reuses clients, and one listener each is enough. */
  private readonly guarded = new WeakSet<PoolClient>();
  private readonly onClientError = (err: Error) =>
    this.logger.warn(`a database connection in use failed; it is dropped when released: ${err.message}`);
  private readonly settings: TransactionSettings;
  private readonly begin: Deferred;
  private readonly statement: (text: string, values: unknown[]) => string | QueryConfig;
  private readonly stopRefusing: () => void;

  constructor(
    private readonly dataSource: DataSource,
    @Inject(IDEMPOTENCY_OPTIONS) options: ResolvedIdempotencyOptions,
  ) {
    this.settings = transactionSettings(options);
    this.begin = { sql: beginStatement(this.settings), params: [] };
    this.statement = this.settings.preparedStatements ? namedStatement : unnamedStatement;
    joinOpenTransactions(dataSource, () => {
      const open = this.current.getStore();
      return open && this.runnerOf(open);
    });
    this.stopRefusing = refuseEscapingWrites({ openClient: () => this.current.getStore()?.client, escapingWrites: options.escapingWrites });
    // Without it pg holds each statement of a batch back until the one before has answered: still correct, one round trip each.
    if ((dataSource.options as { extra?: { pipeline?: unknown } }).extra?.pipeline !== true) {
      this.logger.warn("TypeORM's `extra: { pipeline: true }` is not set: each statement of a transaction waits for the one before it");
    }
  }

  /**
   * TypeORM in the current transaction: repositories and query builders of this manager run on the
   * transaction's connection, between the claim and the recorded answer, and commit (or roll back)
   * with them. Outside a transaction, the DataSource's own manager.
   */
  get manager(): EntityManager {
    const open = this.current.getStore();
    return open ? this.runnerOf(open).manager : this.dataSource.manager;
  }

  onModuleDestroy(): void {
    this.stopRefusing();
  }

  /** The transaction's TypeORM runner, on its connection: one per transaction, so nested `transaction()`s count their savepoints. */
  private runnerOf(open: OpenTransaction): QueryRunner {
    if (!open.runner) {
      const { runner, close } = joinedQueryRunner(this.dataSource, open.client, () => this.flush(open));
      open.runner = runner;
      open.closeRunner = close;
    }
    return open.runner;
  }

  /** `manager.getRepository(target)`: the entity's repository in the current transaction. */
  getRepository<Entity extends ObjectLiteral>(target: EntityTarget<Entity>): Repository<Entity> {
    return this.manager.getRepository(target);
  }

  /**
   * Sends what is queued (BEGIN, deferred statements) ahead of a statement that does not go through
   * `query`, in order: TypeORM's statements share the connection, so a SAVEPOINT queued before them must reach it first.
   */
  private flush(open: OpenTransaction): Promise<unknown> | undefined {
    if (open.state === 'begun' && open.deferred.length === 0) return undefined;
    return this.send(open, this.takeDeferred(open));
  }

  private get pool(): Pool {
    return (this.dataSource.driver as PostgresDriver).master as Pool;
  }

  /** The rows the statement returned (RETURNING rows for INSERT/UPDATE/DELETE). */
  async query<T>(sql: string, params: unknown[] = []): Promise<T[]> {
    const [rows] = await this.queries([{ sql, params }]);
    return rows as T[];
  }

  /** Statements sent together, in order, in the current transaction (or one of their own): the rows of each. */
  async queries(statements: { sql: string; params?: unknown[] }[]): Promise<unknown[][]> {
    const batch = statements.map(({ sql, params }) => ({ sql, params: params ?? [] }));
    const open = this.current.getStore();
    if (open) return (await this.send(open, [...this.takeDeferred(open), ...batch])).slice(-batch.length);
    return this.inTransaction((alone) => this.sendAndCommit(alone, batch));
  }

  /** The batch with everything queued before it and a COMMIT after it, in one write; the batch's rows. */
  private async sendAndCommit(open: OpenTransaction, batch: Deferred[]): Promise<unknown[][]> {
    const results = await this.send(open, [...this.takeDeferred(open), ...batch, COMMIT]);
    open.state = 'not begun';
    return results.slice(-batch.length - 1, -1);
  }

  /**
   * Queues a statement of the current transaction whose result nobody reads: it is sent with the
   * next statement, or with the COMMIT, and an error it raises is thrown there.
   */
  defer(sql: string, params: unknown[] = []): void {
    this.openTransaction('defer').deferred.push({ sql, params });
  }

  /** Bounds the current transaction's lock waits from its next statement on; without `ms`, back to the service's lock_timeout. */
  setLockTimeout(ms?: number): void {
    // lock_timeout 0 means "no limit": one millisecond is the shortest wait PostgreSQL can do.
    this.defer(`SELECT set_config('lock_timeout', $1, true)`, [`${Math.max(1, Math.ceil(ms ?? this.settings.lockTimeoutMs))}ms`]);
  }

  /** A point the current transaction can return to (sent with the next statement). */
  savepoint(name: string): void {
    this.defer(`SAVEPOINT ${name}`);
  }

  /** Undoes everything since `savepoint(name)`; nothing to send when the savepoint itself was never sent. */
  rollbackToSavepoint(name: string): void {
    const open = this.openTransaction('rollbackToSavepoint');
    const at = open.deferred.findIndex((d) => d.sql === `SAVEPOINT ${name}`);
    if (at >= 0) open.deferred.splice(at);
    else open.deferred.push({ sql: `ROLLBACK TO SAVEPOINT ${name}`, params: [] });
  }

  private openTransaction(what: string): OpenTransaction {
    const open = this.current.getStore();
    if (!open) throw new Error(`Database.${what} needs a transaction`);
    return open;
  }

  /** What is queued, to go out ahead of the next statement: BEGIN first, when the transaction has not begun. */
  private takeDeferred(open: OpenTransaction): Deferred[] {
    const begin: Deferred[] = open.state === 'not begun' ? [this.begin] : [];
    open.state = 'begun';
    return [...begin, ...open.deferred.splice(0)];
  }

  /**
   * Sends the statements of one batch and waits for all of them; their rows, in order, or the first error.
   *
   * A 0A000 "cached plan must not change result type" means a schema change altered the result of a
   * named statement this connection had prepared: its cache is discarded (DEALLOCATE ALL, and pg
   * forgets the names), so every later use parses afresh. The batch is then sent once more only
   * when it was the transaction's FIRST: an error aborted the transaction, so nothing it did was
   * committed, and `fn` has seen no result yet, so nothing it decided depends on the failed try —
   * sending the same batch again is the same as the first try never having happened. After a later
   * batch (or with another batch sent behind it), `fn` acted on results, or is waiting for ones the
   * error voided; the error propagates (503, retryable) instead.
   */
  private async send(open: OpenTransaction, statements: Deferred[]): Promise<unknown[][]> {
    const isFirstBatch = open.sent++ === 0;
    try {
      return await this.write(open.client, statements);
    } catch (err) {
      if (!isCachedPlanInvalidated(err)) throw err;
      this.logger.warn(`a schema change invalidated prepared statements (${(err as Error).message}); this connection discards them`);
      await this.rollBackAndDiscardStatements(open);
      // Alone on the wire: no batch went out behind it while it failed.
      const nothingDependsOnIt = isFirstBatch && open.sent === 1;
      if (!nothingDependsOnIt) throw err;
      // The same batch again, its BEGIN included: the transaction begins anew.
      open.state = 'begun';
      return await this.write(open.client, statements);
    }
  }

  /** Ends the aborted transaction and drops the connection's prepared statements, in one write. */
  private async rollBackAndDiscardStatements(open: OpenTransaction): Promise<void> {
    await this.write(open.client, [
      { sql: 'ROLLBACK', params: [] },
      { sql: DISCARD_STATEMENTS, params: [] },
    ]);
    open.state = 'not begun';
    // pg's own record of what it prepared on this connection (not public API): without it, pg would
    // bind the names it believes exist. Should it be missing, the connection is not reused.
    const connection = (open.client as unknown as { connection?: { parsedStatements?: Record<string, string> } }).connection;
    if (connection?.parsedStatements) connection.parsedStatements = {};
    else throw new Error('cannot reset the statement cache of this connection');
  }

  /**
   * Sends the statements in one write (the socket is corked while pg writes them) and waits for all
   * of them; their rows, in order, or the first error. Waiting for all keeps the connection's
   * queue empty whatever fails, so it can be rolled back and released.
   */
  private async write(client: PoolClient, statements: Deferred[]): Promise<unknown[][]> {
    // pg's own socket (not public API: without it the statements still go out in order, one write each).
    const stream = (client as unknown as { connection?: { stream?: { cork?(): void; uncork?(): void } } }).connection?.stream;
    stream?.cork?.();
    let pending: Promise<{ rows: unknown[] }>[];
    try {
      pending = statements.map(({ sql, params }) => client.query(this.statement(sql, params), params));
    } finally {
      stream?.uncork?.();
    }
    const settled = await Promise.allSettled(pending);
    const failed = settled.find((r) => r.status === 'rejected');
    if (failed) throw failed.reason;
    return settled.map((r) => (r as PromiseFulfilledResult<{ rows: unknown[] }>).value.rows);
  }

  /**
   * A pooled connection, or PoolExhaustedError once the pool's `connectionTimeoutMillis` has passed without one.
   * With the server down, this fails at once (ECONNREFUSED): no retry here, the client is told 503.
   */
  private async connect(): Promise<PoolClient> {
    let client: PoolClient;
    try {
      client = await this.pool.connect();
    } catch (err) {
      // pg-pool's words for its connectionTimeoutMillis; anything else is a real connection failure.
      if (err instanceof Error && err.message === 'timeout exceeded when trying to connect') throw new PoolExhaustedError({ cause: err });
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
   * before the caller locks the rows it needs): done inside, it would wait on the caller's own locks.
   */
  outsideTransaction<T>(fn: () => Promise<T>): Promise<T> {
    return this.current.exit(fn);
  }

  /** Runs `fn` in a transaction (READ COMMITTED), or in the one already open. Commits when it resolves, rolls back when it throws. */
  async transaction<T>(fn: () => Promise<T>): Promise<T> {
    if (this.current.getStore()) return fn();
    return this.inTransaction(async (open) => {
      const result = await this.current.run(open, fn).finally(() => open.closeRunner?.());
      // Nothing sent and nothing queued: there is no transaction to end.
      if (open.state === 'begun' || open.deferred.length > 0) await this.sendAndCommit(open, []);
      return result;
    });
  }

  /** A connection for `fn`'s transaction; rolled back when `fn` throws with the transaction still open, then released. */
  private async inTransaction<T>(fn: (open: OpenTransaction) => Promise<T>): Promise<T> {
    const client = await this.connect();
    const open: OpenTransaction = { client, state: 'not begun', sent: 0, deferred: [] };
    let broken: Error | undefined;
    try {
      return await fn(open);
    } catch (err) {
      if (isDatabaseUnavailable(err)) broken = err as Error;
      // A connection that cannot even roll back is dropped, not handed to the next request.
      // (After a failed COMMIT the transaction is over already: the server says so, nothing is sent.)
      else if (open.state === 'begun' && client.getTransactionStatus() !== 'I') {
        await client.query('ROLLBACK').catch((rollbackError: unknown) => {
          broken = rollbackError instanceof Error ? rollbackError : new Error('ROLLBACK failed', { cause: rollbackError });
        });
      }
      throw err;
    } finally {
      client.release(broken);
    }
  }
}
