/**
 * Database: statements sent together (BEGIN with the first statement; deferred statements with the
 * next one or the COMMIT) must mean exactly what sending them one by one means. On a real PostgreSQL.
 */
import { DataSource } from 'typeorm';
import { Database, isCachedPlanInvalidated } from '@idempotent-orders/idempotency';
import { resolveIdempotencyOptions } from './support/idempotency-internals';
import { typeormOptions } from '../src/database/typeorm-options';
import { createTestDatabase, ignoreIdleErrors } from './support/test-app';
import { jest } from '@jest/globals';
import { Client, Pool } from 'pg';

describe('Database: pipelined transactions', () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let dataSource: DataSource;
  let db: Database;
  let check: Pool;
  beforeAll(async () => {
    database = await createTestDatabase();
    dataSource = new DataSource(typeormOptions(database.url, { poolSize: 2 }));
    await dataSource.initialize();
    db = new Database(dataSource, resolveIdempotencyOptions({ callerScope: () => 'test', waitMs: 2000 }));
    check = ignoreIdleErrors(new Pool({ connectionString: database.url, max: 1 }));
    await check.query(`CREATE TABLE pipeline_probe (id int PRIMARY KEY, note text)`);
  });
  afterAll(async () => {
    await check?.end();
    await dataSource?.destroy();
    await database?.drop();
  });
  beforeEach(async () => {
    await check.query(`TRUNCATE pipeline_probe`);
  });
  const notes = async () => (await check.query<{ note: string }>(`SELECT note FROM pipeline_probe ORDER BY id`)).rows.map((r) => r.note);
  it('commits the statements and the deferred ones, in order, with the COMMIT', async () => {
    const rows = await db.transaction(async () => {
      db.defer(`INSERT INTO pipeline_probe VALUES (1, 'deferred first')`);
      const inserted = await db.query<{ id: number }>(`INSERT INTO pipeline_probe VALUES ($1, $2) RETURNING id`, [2, 'then this']);
      db.defer(`UPDATE pipeline_probe SET note = note || ', updated at commit' WHERE id = $1`, [2]);
      return inserted;
    });
    expect(rows).toEqual([{ id: 2 }]);
    expect(await notes()).toEqual(['deferred first', 'then this, updated at commit']);
  });

  it("a deferred statement's error is thrown at COMMIT, and nothing of the transaction is kept", async () => {
    const failing = db.transaction(async () => {
      await db.query(`INSERT INTO pipeline_probe VALUES ($1, $2)`, [1, 'kept?']);
      db.defer(`INSERT INTO pipeline_probe VALUES ($1, $2)`, [1, 'duplicate id']);
    });
    await expect(failing).rejects.toMatchObject({ code: '23505' });
    expect(await notes()).toEqual([]);
    // The connection went back to the pool clean: the next transaction works.
    await db.transaction(() => db.query(`INSERT INTO pipeline_probe VALUES ($1, $2)`, [3, 'after']));
    expect(await notes()).toEqual(['after']);
  });

  it("a batch throws its first statement's error, not the aborted-transaction error of the ones behind it", async () => {
    const failing = db.transaction(async () => {
      db.defer(`INSERT INTO pipeline_probe VALUES ($1, $2)`, [1, 'a']);
      db.defer(`INSERT INTO pipeline_probe VALUES ($1, $2)`, [1, 'b']); // 23505
      await db.query(`SELECT 1`); // sent behind it: fails with 25P02
    });
    await expect(failing).rejects.toMatchObject({ code: '23505' });
    expect(await notes()).toEqual([]);
  });

  it('rolling back to a savepoint never sent drops what was deferred after it, and nothing before it', async () => {
    await db.transaction(async () => {
      await db.query(`INSERT INTO pipeline_probe VALUES ($1, $2)`, [1, 'before the savepoint']);
      db.savepoint('probe');
      db.defer(`INSERT INTO pipeline_probe VALUES ($1, $2)`, [2, 'undone']);
      db.rollbackToSavepoint('probe');
      db.defer(`INSERT INTO pipeline_probe VALUES ($1, $2)`, [3, 'after the rollback']);
    });
    expect(await notes()).toEqual(['before the savepoint', 'after the rollback']);
  });

  it('rolling back to a savepoint that was sent undoes the statements after it', async () => {
    await db.transaction(async () => {
      await db.query(`INSERT INTO pipeline_probe VALUES ($1, $2)`, [1, 'kept']);
      db.savepoint('probe');
      await db.query(`INSERT INTO pipeline_probe VALUES ($1, $2)`, [2, 'undone']);
      db.rollbackToSavepoint('probe');
      db.defer(`INSERT INTO pipeline_probe VALUES ($1, $2)`, [3, 'recorded after the rollback']);
    });
    expect(await notes()).toEqual(['kept', 'recorded after the rollback']);
  });

  it('a transaction that makes no statement sends nothing at all; one that fails after a statement rolls back', async () => {
    const sent = jest.spyOn(Client.prototype, 'query');
    try {
      expect(await db.transaction(() => Promise.resolve('nothing to do'))).toBe('nothing to do');
      await expect(
        db.transaction(() => {
          db.defer(`INSERT INTO pipeline_probe VALUES (1, 'never sent')`);
          return Promise.reject(new Error('the handler failed'));
        }),
      ).rejects.toThrow('the handler failed');
      expect(sent).not.toHaveBeenCalled(); // no BEGIN, no ROLLBACK, no deferred statement
      // The spy does watch the connections Database uses: one statement is seen (with its BEGIN and COMMIT).
      await db.transaction(() => db.query('SELECT 1'));
      expect(sent).toHaveBeenCalled();
    } finally {
      sent.mockRestore();
    }
    await expect(
      db.transaction(async () => {
        await db.query(`INSERT INTO pipeline_probe VALUES (1, 'rolled back')`);
        throw new Error('after a statement');
      }),
    ).rejects.toThrow('after a statement');
    expect(await notes()).toEqual([]);
  });

  it('defer and savepoints outside a transaction are a programming error, said at once', () => {
    expect(() => db.defer('SELECT 1')).toThrow('Database.defer needs a transaction');
    expect(() => db.savepoint('x')).toThrow('needs a transaction');
    expect(() => db.rollbackToSavepoint('x')).toThrow('Database.rollbackToSavepoint needs a transaction');
  });

  it('every transaction, and a statement on its own, runs under the settings; the session carries none', async () => {
    const setting = `SELECT current_setting('lock_timeout') AS lock, current_setting('statement_timeout') AS statement, current_setting('idle_in_transaction_session_timeout') AS idle`;
    const expected = [{ lock: '2s', statement: '30s', idle: '1min' }];
    expect(await db.transaction(() => db.query(setting))).toEqual(expected);
    expect(await db.query(setting)).toEqual(expected);
    // The connection itself keeps the server's defaults: nothing leaks to whoever a pooler gives it to next.
    const [session] = await dataSource.query<{ lock: string }[]>(`SELECT current_setting('lock_timeout') AS lock`);
    expect(session.lock).toBe('0');
    // The claim narrows lock_timeout for a while, then gives the transaction its own back.
    expect(
      await db.transaction(async () => {
        db.setLockTimeout(250);
        const [narrowed] = await db.query<{ lock: string }>(`SELECT current_setting('lock_timeout') AS lock`);
        db.setLockTimeout();
        const [restored] = await db.query<{ lock: string }>(`SELECT current_setting('lock_timeout') AS lock`);
        return [narrowed.lock, restored.lock];
      }),
    ).toEqual(['250ms', '2s']);
  });
});

describe('Database: a column added or dropped under prepared statements (0A000)', () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let dataSource: DataSource;
  let check: Pool;
  /** One connection, so every statement below runs where the earlier ones were prepared. */
  const open = async (env: Record<string, string> = {}) => {
    dataSource = new DataSource(typeormOptions(database.url, { poolSize: 1 }));
    await dataSource.initialize();
    return new Database(
      dataSource,
      resolveIdempotencyOptions({ callerScope: () => 'test', preparedStatements: env.DATABASE_PREPARED_STATEMENTS !== 'false' }),
    );
  };
  beforeEach(async () => {
    database = await createTestDatabase();
    check = ignoreIdleErrors(new Pool({ connectionString: database.url, max: 1 }));
    await check.query(`CREATE TABLE schema_probe (id int PRIMARY KEY, note text)`);
    await check.query(`INSERT INTO schema_probe VALUES (1, 'one')`);
  });
  afterEach(async () => {
    await check?.end();
    await dataSource?.destroy();
    await database?.drop();
  });
  // A statement that depends on the table's column list: exactly what the service's SQL no longer does.
  const readAll = `SELECT * FROM schema_probe WHERE id = $1`;
  const prepared = async () => (await dataSource.query<{ n: number }[]>(`SELECT count(*)::int AS n FROM pg_prepared_statements`))[0].n;

  it("a transaction's first batch is sent again after the connection's statements are discarded: the caller never sees the error", async () => {
    const db = await open();
    expect(await db.query(readAll, [1])).toEqual([{ id: 1, note: 'one' }]);
    expect(await db.transaction(() => db.query(readAll, [1]))).toEqual([{ id: 1, note: 'one' }]);
    await check.query(`ALTER TABLE schema_probe ADD COLUMN added text`);
    expect(await db.query(readAll, [1])).toEqual([{ id: 1, note: 'one', added: null }]);
    await check.query(`ALTER TABLE schema_probe DROP COLUMN note`);
    expect(await db.transaction(() => db.query(readAll, [1]))).toEqual([{ id: 1, added: null }]);
  });

  it('after a later batch the transaction fails with the 0A000 (answered 503), nothing of it is kept, and the connection works again', async () => {
    const db = await open();
    expect(await db.query(readAll, [1])).toEqual([{ id: 1, note: 'one' }]);
    await check.query(`ALTER TABLE schema_probe ADD COLUMN added text`);
    const failing = db.transaction(async () => {
      await db.query(`INSERT INTO schema_probe (id, note) VALUES ($1, $2)`, [2, 'rolled back']);
      return db.query(readAll, [1]);
    });
    await expect(failing).rejects.toMatchObject({ code: '0A000' });
    await failing.catch((err: unknown) => expect(isCachedPlanInvalidated(err)).toBe(true));
    expect((await check.query(`SELECT id FROM schema_probe ORDER BY id`)).rows).toEqual([{ id: 1 }]);
    expect(await db.transaction(() => db.query(readAll, [1]))).toEqual([{ id: 1, note: 'one', added: null }]);
  });

  it('a first batch with another already sent behind it: the transaction fails whole, nothing of it is kept, and the connection recovers', async () => {
    const db = await open();
    expect(await db.query(readAll, [1])).toEqual([{ id: 1, note: 'one' }]);
    await check.query(`ALTER TABLE schema_probe ADD COLUMN added text`);
    const failing = db.transaction(() =>
      Promise.all([db.query(readAll, [1]), db.query(`INSERT INTO schema_probe (id, note) VALUES ($1, $2)`, [2, 'rolled back'])]),
    );
    // Whichever of the two errors reaches Promise.all first: the 0A000, or the aborted transaction's 25P02 behind it.
    await expect(failing).rejects.toMatchObject({ code: expect.stringMatching(/^(0A000|25P02)$/) });
    expect((await check.query(`SELECT id FROM schema_probe ORDER BY id`)).rows).toEqual([{ id: 1 }]);
    expect(await db.query(readAll, [1])).toEqual([{ id: 1, note: 'one', added: null }]);
  });

  it('with DATABASE_PREPARED_STATEMENTS=false nothing is prepared on the server, and a schema change costs no error at all', async () => {
    const failures = jest.spyOn(
      Database.prototype as unknown as { rollBackAndDiscardStatements(): Promise<void> },
      'rollBackAndDiscardStatements',
    );
    try {
      const db = await open({ DATABASE_PREPARED_STATEMENTS: 'false' });
      expect(await db.query(readAll, [1])).toEqual([{ id: 1, note: 'one' }]);
      await check.query(`ALTER TABLE schema_probe ADD COLUMN added text`);
      expect(await db.transaction(() => db.query(readAll, [1]))).toEqual([{ id: 1, note: 'one', added: null }]);
      expect(await prepared()).toBe(0);
      expect(failures).not.toHaveBeenCalled();
    } finally {
      failures.mockRestore();
    }
  });

  it('with named statements on (the default) they are prepared once per connection', async () => {
    const db = await open();
    await db.query(readAll, [1]);
    await db.query(readAll, [1]);
    expect(await prepared()).toBe(1);
  });
});
