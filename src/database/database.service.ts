import { Injectable } from '@nestjs/common';
import { AsyncLocalStorage } from 'node:async_hooks';
import type { Pool, PoolClient } from 'pg';
import { DataSource } from 'typeorm';
import type { PostgresDriver } from 'typeorm/driver/postgres/PostgresDriver.js';

/**
 * SQL in the current transaction. `transaction(fn)` opens one and every `query` made while `fn`
 * runs — in this service or any other — joins it, so an interceptor can claim an idempotency key,
 * let the handler write, and record the response in ONE commit.
 *
 * It talks to TypeORM's own `pg` pool directly: the hot path is hand-written SQL, and TypeORM's
 * QueryRunner per statement costs CPU the 2-core benchmark machine shares with PostgreSQL.
 * (@nestjs-cls/transactional would carry the transaction too, but it is CommonJS that
 * require()s the ESM-only Nest 12, which Jest cannot load on Node 20.)
 */
/** Every pooled connection stayed busy for DATABASE_POOL_WAIT_MS: the service is overloaded, retry shortly. */
export class PoolExhaustedError extends Error {
  constructor(options?: ErrorOptions) {
    super('No database connection became free in time', options);
    this.name = 'PoolExhaustedError';
  }
}

@Injectable()
export class Database {
  private readonly current = new AsyncLocalStorage<PoolClient>();

  constructor(private readonly dataSource: DataSource) {}

  private get pool(): Pool {
    return (this.dataSource.driver as PostgresDriver).master as Pool;
  }

  /** The rows the statement returned (RETURNING rows for INSERT/UPDATE/DELETE). */
  async query<T>(sql: string, params: unknown[] = []): Promise<T[]> {
    const open = this.current.getStore();
    if (open) return (await open.query(sql, params)).rows as T[];
    const client = await this.connect();
    try {
      return (await client.query(sql, params)).rows as T[];
    } finally {
      client.release();
    }
  }

  /** A pooled connection, or PoolExhaustedError once DATABASE_POOL_WAIT_MS has passed without one. */
  private async connect(): Promise<PoolClient> {
    try {
      return await this.pool.connect();
    } catch (err) {
      // pg-pool's words for its connectionTimeoutMillis; anything else is a real connection failure.
      if (err instanceof Error && err.message === 'timeout exceeded when trying to connect') throw new PoolExhaustedError({ cause: err });
      throw err;
    }
  }

  /** Runs `fn` in a transaction (READ COMMITTED), or in the one already open. Commits when it resolves, rolls back when it throws. */
  async transaction<T>(fn: () => Promise<T>): Promise<T> {
    if (this.current.getStore()) return fn();
    const client = await this.connect();
    let reusable = true;
    try {
      await client.query('BEGIN');
      const result = await this.current.run(client, fn);
      await client.query('COMMIT');
      return result;
    } catch (err) {
      // A connection that cannot even roll back is dropped, not handed to the next request.
      await client.query('ROLLBACK').catch(() => (reusable = false));
      throw err;
    } finally {
      client.release(!reusable);
    }
  }
}
