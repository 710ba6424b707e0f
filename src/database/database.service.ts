import { Injectable } from '@nestjs/common';
import { AsyncLocalStorage } from 'node:async_hooks';
import { DataSource, type EntityManager } from 'typeorm';

/**
 * SQL in the current transaction. `transaction(fn)` opens one and every `query` made while `fn`
 * runs — in this service or any other — joins it, so an interceptor can claim an idempotency key,
 * let the handler write, and record the response in ONE commit.
 *
 * (@nestjs-cls/transactional does this too, but it is CommonJS that require()s the ESM-only
 * Nest 12: Jest cannot load it on Node 20. Twenty lines of AsyncLocalStorage can.)
 */
@Injectable()
export class Database {
  private readonly current = new AsyncLocalStorage<EntityManager>();

  constructor(private readonly dataSource: DataSource) {}

  /** The rows the statement returned (for UPDATE/DELETE … RETURNING too, where TypeORM's plain query() returns [rows, count]). */
  async query<T>(sql: string, params: unknown[] = []): Promise<T[]> {
    const runner = this.current.getStore()?.queryRunner ?? this.dataSource.createQueryRunner();
    try {
      const result = await runner.query(sql, params, true);
      return result.records as T[];
    } finally {
      if (runner !== this.current.getStore()?.queryRunner) await runner.release();
    }
  }

  /** Runs `fn` in a transaction (READ COMMITTED), or in the one already open. Commits when it resolves, rolls back when it throws. */
  transaction<T>(fn: () => Promise<T>): Promise<T> {
    if (this.current.getStore()) return fn();
    return this.dataSource.transaction((manager) => this.current.run(manager, fn));
  }

  get inTransaction(): boolean {
    return this.current.getStore() !== undefined;
  }
}
