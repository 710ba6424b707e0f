import { Injectable, Logger } from '@nestjs/common';
import { AsyncLocalStorage } from 'node:async_hooks';
import type { Pool, PoolClient, QueryConfig } from 'pg';
import { DataSource } from 'typeorm';
import type { PostgresDriver } from 'typeorm/driver/postgres/PostgresDriver.js';
import { isDatabaseUnavailable } from './pg-errors.js';

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
 * parsing them again each time costs PostgreSQL CPU on the 2 cores it shares with this process.
 * PostgreSQL re-plans a prepared statement by itself when the schema under it changes.
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

/** Every pooled connection stayed busy for DATABASE_POOL_WAIT_MS: the service is overloaded, retry shortly. */
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

/** The transaction `transaction(fn)` opened, as every query made while `fn` runs finds it. */
interface OpenTransaction {
  client: PoolClient;
  /** False until BEGIN has been sent: a transaction that makes no query costs no round trip at all. */
  begun: boolean;
  /** Sent, in order, in the same write as the next statement (or the COMMIT). */
  deferred: Deferred[];
}

/**
 * SQL in the current transaction. `transaction(fn)` opens one and every `query` made while `fn`
 * runs — in this service or any other — joins it, so an interceptor can claim an idempotency key,
 * let the handler write, and record the response in ONE commit.
 *
 * Round trips are the cost that matters on a small machine (each is a write to the socket and a
 * wake-up of a PostgreSQL backend), so a transaction sends what it can together, over a pipelined
 * connection (pg's `pipeline` mode: each statement keeps its own result and error):
 * - BEGIN goes out with the transaction's first statement;
 * - `defer(sql)` queues a statement whose result nobody reads (a SAVEPOINT, recording a response):
 *   it goes out with the next statement, or with the COMMIT;
 * so an idempotent create is three round trips: BEGIN + claim, SAVEPOINT + insert, record + COMMIT.
 * The order of statements, and so every guarantee, is exactly that of sending them one by one; a
 * batch's first error is the one thrown (the statements after it fail only because it aborted the
 * transaction).
 *
 * It talks to TypeORM's own `pg` pool directly: the hot path is hand-written SQL, and TypeORM's
 * QueryRunner per statement costs CPU the 2-core benchmark machine shares with PostgreSQL.
 * (@nestjs-cls/transactional would carry the transaction too, but it is CommonJS that
 * require()s the ESM-only Nest 12, which Jest cannot load on Node 20.)
 *
 * A database restart must not take the process down: pg emits 'error' on a checked-out client
 * whose server goes away between two queries, and pg-pool listens only while the client is idle
 * (TypeORM's pool handler then logs it). So every client this class checks out gets a listener of
 * its own, and a client whose connection broke is released with the error, so the pool drops it.
 */
@Injectable()
export class Database {
  private readonly logger = new Logger('Database');
  private readonly current = new AsyncLocalStorage<OpenTransaction>();
  /** Clients that already carry our 'error' listener: pg reuses clients, and one listener each is enough. */
  private readonly guarded = new WeakSet<PoolClient>();
  private readonly onClientError = (err: Error) =>
    this.logger.warn({ err }, 'a database connection in use failed; it is dropped when released');

  constructor(private readonly dataSource: DataSource) {}

  private get pool(): Pool {
    return (this.dataSource.driver as PostgresDriver).master as Pool;
  }

  /** The rows the statement returned (RETURNING rows for INSERT/UPDATE/DELETE). */
  async query<T>(sql: string, params: unknown[] = []): Promise<T[]> {
    const open = this.current.getStore();
    if (open) {
      const results = await this.send(open, [...this.takeDeferred(open), { sql, params }]);
      return results[results.length - 1] as T[];
    }
    const client = await this.connect();
    let broken: Error | undefined;
    try {
      return (await client.query(namedStatement(sql, params), params)).rows as T[];
    } catch (err) {
      if (isDatabaseUnavailable(err)) broken = err as Error;
      throw err;
    } finally {
      client.release(broken);
    }
  }

  /**
   * Queues a statement of the current transaction whose result nobody reads: it is sent with the
   * next statement, or with the COMMIT, and an error it raises is thrown there.
   */
  defer(sql: string, params: unknown[] = []): void {
    this.openTransaction('defer').deferred.push({ sql, params });
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

  private takeDeferred(open: OpenTransaction): Deferred[] {
    const taken: Deferred[] = open.begun ? [] : [{ sql: 'BEGIN', params: [] }];
    open.begun = true;
    return taken.concat(open.deferred.splice(0));
  }

  /**
   * Sends the statements in one write (the socket is corked while pg writes them) and waits for all
   * of them; their rows, in order, or the first error. Waiting for all keeps the connection's
   * queue empty whatever fails, so it can be rolled back and released.
   */
  private async send(open: OpenTransaction, statements: Deferred[]): Promise<unknown[][]> {
    // pg's own socket (not public API: without it the statements still go out in order, one write each).
    const stream = (open.client as unknown as { connection?: { stream?: { cork?(): void; uncork?(): void } } }).connection?.stream;
    stream?.cork?.();
    let pending: Promise<{ rows: unknown[] }>[];
    try {
      pending = statements.map(({ sql, params }) => open.client.query(namedStatement(sql, params), params));
    } finally {
      stream?.uncork?.();
    }
    const settled = await Promise.allSettled(pending);
    const failed = settled.find((r) => r.status === 'rejected');
    if (failed) throw failed.reason;
    return settled.map((r) => (r as PromiseFulfilledResult<{ rows: unknown[] }>).value.rows);
  }

  /**
   * A pooled connection, or PoolExhaustedError once DATABASE_POOL_WAIT_MS has passed without one.
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
   * For work that must commit on its own before the caller's transaction goes on (settling a stale payment
   * before a cancel locks the order): done inside, it would wait on the caller's own locks.
   */
  outsideTransaction<T>(fn: () => Promise<T>): Promise<T> {
    return this.current.exit(fn);
  }

  /** Runs `fn` in a transaction (READ COMMITTED), or in the one already open. Commits when it resolves, rolls back when it throws. */
  async transaction<T>(fn: () => Promise<T>): Promise<T> {
    if (this.current.getStore()) return fn();
    const client = await this.connect();
    const open: OpenTransaction = { client, begun: false, deferred: [] };
    let broken: Error | undefined;
    try {
      const result = await this.current.run(open, fn);
      // Nothing sent and nothing queued: there is no transaction to end.
      if (open.begun || open.deferred.length > 0) await this.send(open, [...this.takeDeferred(open), { sql: 'COMMIT', params: [] }]);
      return result;
    } catch (err) {
      // A connection that cannot even roll back is dropped, not handed to the next request.
      // (After a failed COMMIT the transaction is over already; ROLLBACK then only warns.)
      if (open.begun) {
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
