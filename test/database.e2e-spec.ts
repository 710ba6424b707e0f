/**
 * Database: one transaction per `transaction(fn)`, every statement sent where it is written, a lifecycle that ends at
 * COMMIT or ROLLBACK. On a real PostgreSQL.
 */
import { DataSource } from 'typeorm';
import {
  Database,
  DatabaseNotAnsweringError,
  isCachedPlanInvalidated,
  isDatabaseUnavailable,
  PoolExhaustedError,
  TransactionRolledBackError,
} from '@idempotent-orders/idempotency';
import { resolveIdempotencyOptions } from './support/idempotency-internals';
import { typeormOptions } from '../src/database/typeorm-options';
import { createTestDatabase, ignoreIdleErrors } from './support/test-app';
import { Client, Pool } from 'pg';

describe('Database: transactions', () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let dataSource: DataSource;
  let db: Database;
  let check: Pool;
  beforeAll(async () => {
    database = await createTestDatabase();
    dataSource = new DataSource(typeormOptions(database.url, { poolSize: 1 }));
    await dataSource.initialize();
    db = new Database(dataSource, resolveIdempotencyOptions({ callerScope: () => 'test', waitMs: 2000 })).attach();
    check = ignoreIdleErrors(new Pool({ connectionString: database.url, max: 1 }));
    await check.query(`CREATE TABLE tx_probe (id int PRIMARY KEY, note text)`);
  });
  afterAll(async () => {
    db?.onModuleDestroy();
    await check?.end();
    await dataSource?.destroy();
    await database?.drop();
  });
  beforeEach(async () => {
    await check.query(`TRUNCATE tx_probe`);
  });
  const notes = async () => (await check.query<{ note: string }>(`SELECT note FROM tx_probe ORDER BY id`)).rows.map((r) => r.note);
  const insert = (id: number, note: string) => db.query(`INSERT INTO tx_probe VALUES ($1, $2)`, [id, note]);

  it('commits what fn wrote, in order; rolls all of it back when fn throws', async () => {
    const rows = await db.transaction(async () => {
      await insert(1, 'first');
      return db.query<{ id: number }>(`INSERT INTO tx_probe VALUES ($1, $2) RETURNING id`, [2, 'second']);
    });
    expect(rows).toEqual([{ id: 2 }]);
    await expect(
      db.transaction(async () => {
        await insert(3, 'rolled back');
        throw new Error('fn failed');
      }),
    ).rejects.toThrow('fn failed');
    expect(await notes()).toEqual(['first', 'second']);
  });

  it('a COMMIT PostgreSQL answers with ROLLBACK (an error caught and ignored in fn) is a TransactionRolledBackError, not a commit', async () => {
    const swallowed = db.transaction(async () => {
      await insert(1, 'lost with the rollback');
      await insert(1, 'duplicate id').catch(() => undefined); // 23505, ignored: the transaction is aborted
      return 'fn thinks it is done';
    });
    await expect(swallowed).rejects.toBeInstanceOf(TransactionRolledBackError);
    expect(await notes()).toEqual([]);
    // The one connection of the pool went back clean.
    await insert(2, 'after');
    expect(await notes()).toEqual(['after']);
  });

  it('use after the end, from work fn left running, throws and sends nothing: the pooled connection is not touched', async () => {
    let leftover: Promise<unknown> | undefined;
    await db.transaction(async () => {
      await insert(1, 'committed');
      leftover = new Promise((resolve) => setTimeout(resolve, 20)).then(() => insert(2, 'after the end'));
    });
    await expect(leftover).rejects.toMatchObject({ name: 'TransactionEndedError' });
    let leftoverTransaction: Promise<unknown> | undefined;
    let leftoverManager: Promise<unknown> | undefined;
    await db.transaction(async () => {
      await insert(3, 'committed too');
      const later = new Promise((resolve) => setTimeout(resolve, 20));
      leftoverTransaction = later.then(() => db.transaction(() => insert(4, 'a transaction after the end')));
      leftoverManager = later.then(() => dataSource.query(`INSERT INTO tx_probe VALUES (5, 'through TypeORM after the end')`));
    });
    await expect(leftoverTransaction).rejects.toMatchObject({ name: 'TransactionEndedError' });
    await expect(leftoverManager).rejects.toMatchObject({ name: 'TransactionEndedError' });
    // Pool of one: had anything been sent, this autocommit write would have joined an orphaned transaction.
    await insert(6, 'next');
    const [{ state }] = (
      await check.query<{ state: string }>(`SELECT state FROM pg_stat_activity WHERE application_name = 'idempotent-orders'`)
    ).rows;
    expect(state).toBe('idle');
    expect(await notes()).toEqual(['committed', 'committed too', 'next']);
  });

  it('work that outlives fn runs outside it when started with outsideTransaction()', async () => {
    let background: Promise<unknown> | undefined;
    await db.transaction(async () => {
      background = db.outsideTransaction(() => new Promise((resolve) => setTimeout(resolve, 20)).then(() => insert(2, 'its own')));
      await insert(1, 'the transaction');
    });
    await background;
    expect(await notes()).toEqual(['the transaction', 'its own']);
  });

  it('savepoints: rolling back to one undoes the statements after it, and nothing before it', async () => {
    await db.transaction(async () => {
      await insert(1, 'kept');
      await db.savepoint('probe');
      await insert(2, 'undone');
      await db.rollbackToSavepoint('probe');
      await insert(3, 'after the rollback');
    });
    expect(await notes()).toEqual(['kept', 'after the rollback']);
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
        await db.setLockTimeout(250);
        const [narrowed] = await db.query<{ lock: string }>(`SELECT current_setting('lock_timeout') AS lock`);
        await db.setLockTimeout();
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

  it("a transaction's first statement is sent again on a fresh connection: the caller never sees the error", async () => {
    const db = await open();
    expect(await db.query(readAll, [1])).toEqual([{ id: 1, note: 'one' }]);
    expect(await db.transaction(() => db.query(readAll, [1]))).toEqual([{ id: 1, note: 'one' }]);
    await check.query(`ALTER TABLE schema_probe ADD COLUMN added text`);
    expect(await db.query(readAll, [1])).toEqual([{ id: 1, note: 'one', added: null }]);
    await check.query(`ALTER TABLE schema_probe DROP COLUMN note`);
    expect(await db.transaction(() => db.query(readAll, [1]))).toEqual([{ id: 1, added: null }]);
  });

  it('after a later statement the transaction fails with the 0A000 (answered 503), nothing of it is kept, and the connection works again', async () => {
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

  it('a first statement with another already sent behind it: the transaction fails whole, nothing of it is kept, and the connection recovers', async () => {
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

  /** Runs `fn` while the test database takes no new connections (set from the admin database: a session cannot shut its own). */
  async function refusingConnections<T>(fn: () => Promise<T>): Promise<T> {
    const gate = ignoreIdleErrors(new Client({ connectionString: process.env.TEST_ADMIN_URL }));
    await gate.connect();
    const name = new URL(database.url).pathname.slice(1);
    const allowConnections = (allow: boolean) => gate.query(`ALTER DATABASE "${name}" ALLOW_CONNECTIONS ${allow}`);
    try {
      await allowConnections(false);
      return await fn();
    } finally {
      await allowConnections(true);
      await gate.end();
    }
  }

  it("a first statement whose fresh connection cannot be had: the connect's error, the stale connection released once, and the pool whole after", async () => {
    const db = await open();
    expect(await db.query(readAll, [1])).toEqual([{ id: 1, note: 'one' }]);
    await check.query(`ALTER TABLE schema_probe ADD COLUMN added text`);
    await refusingConnections(() =>
      expect(db.transaction(() => db.query(readAll, [1]))).rejects.toThrow(/not currently accepting connections/),
    );
    expect(await db.query(readAll, [1])).toEqual([{ id: 1, note: 'one', added: null }]);
  });

  it('and when fn catches that error and goes on: nothing is sent on the dropped connection, and the transaction does not commit', async () => {
    const db = await open();
    expect(await db.query(readAll, [1])).toEqual([{ id: 1, note: 'one' }]);
    await check.query(`ALTER TABLE schema_probe ADD COLUMN added text`);
    let next: unknown;
    await refusingConnections(async () => {
      const swallowing = db.transaction(async () => {
        await db.query(readAll, [1]).catch(() => undefined);
        next = await db.query(`INSERT INTO schema_probe (id, note) VALUES (2, 'after the failed connect')`).catch((err: unknown) => err);
      });
      await expect(swallowing).rejects.toBeInstanceOf(TransactionRolledBackError);
    });
    // The statement after it got the connect's error again, not "Client was closed and is not queryable".
    expect(next).toMatchObject({ message: expect.stringMatching(/not currently accepting connections/) });
    expect((await check.query(`SELECT id FROM schema_probe ORDER BY id`)).rows).toEqual([{ id: 1 }]);
    expect(await db.query(readAll, [1])).toEqual([{ id: 1, note: 'one', added: null }]);
  });

  it('with DATABASE_PREPARED_STATEMENTS=false nothing is prepared on the server, and a schema change costs no error at all', async () => {
    const db = await open({ DATABASE_PREPARED_STATEMENTS: 'false' });
    expect(await db.query(readAll, [1])).toEqual([{ id: 1, note: 'one' }]);
    await check.query(`ALTER TABLE schema_probe ADD COLUMN added text`);
    expect(await db.transaction(() => db.query(readAll, [1]))).toEqual([{ id: 1, note: 'one', added: null }]);
    expect(await prepared()).toBe(0);
  });

  it('with named statements on (the default) they are prepared once per connection', async () => {
    const db = await open();
    await db.query(readAll, [1]);
    await db.query(readAll, [1]);
    expect(await prepared()).toBe(1);
  });
});

describe('Database: a pool wait that runs out', () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let dataSource: DataSource;
  let db: Database;
  let locks: Pool;
  beforeAll(async () => {
    database = await createTestDatabase();
    dataSource = new DataSource(typeormOptions(database.url, { poolSize: 1, poolWaitMs: 300 }));
    await dataSource.initialize();
    db = new Database(dataSource, resolveIdempotencyOptions({ callerScope: () => 'test', waitMs: 2000 })).attach();
    locks = ignoreIdleErrors(new Pool({ connectionString: database.url, max: 2 }));
  });
  afterAll(async () => {
    db?.onModuleDestroy();
    await locks?.end();
    await dataSource?.destroy();
    await database?.drop();
  });

  /** A session of `locks` holding advisory lock `key` until `release()`. */
  async function held(key: number) {
    const client = await locks.connect();
    await client.query(`SELECT pg_advisory_lock($1)`, [key]);
    return {
      release: async () => {
        await client.query(`SELECT pg_advisory_unlock($1)`, [key]);
        client.release();
      },
    };
  }
  const blockedOn = (key: number) => db.transaction(() => db.query(`SELECT pg_advisory_xact_lock($1)`, [key]));

  it('the database last found unreachable and nothing ended well since (a restart behind a pooler): unavailable, not overloaded', async () => {
    // A transaction whose connection is cut under it (as a restart cuts them): the database was found unreachable.
    const cut = db.transaction(async () => {
      const [{ pid }] = await db.query<{ pid: number }>(`SELECT pg_backend_pid() AS pid`);
      await locks.query(`SELECT pg_terminate_backend($1)`, [pid]);
      await db.query(`SELECT 1`);
    });
    expect(
      isDatabaseUnavailable(
        await cut.then(
          () => undefined,
          (err: unknown) => err,
        ),
      ),
    ).toBe(true);
    const lock = await held(1);
    const holder = blockedOn(1);
    const waiter = db.query(`SELECT 1`);
    await expect(waiter).rejects.toBeInstanceOf(DatabaseNotAnsweringError);
    expect(isDatabaseUnavailable(await waiter.catch((err: unknown) => err))).toBe(true);
    await lock.release();
    await holder;
  });

  it('every connection held by a statement waiting on a lock, the database answering: overloaded', async () => {
    const lock = await held(4);
    const holder = blockedOn(4);
    await expect(db.query(`SELECT 1`)).rejects.toBeInstanceOf(PoolExhaustedError);
    await lock.release();
    await holder;
  });

  it('transactions ended while it waited, just not soon enough for it: overloaded', async () => {
    const [first, second] = [await held(2), await held(3)];
    const holder = blockedOn(2);
    // Queued first: gets the connection when the holder ends, and keeps it (blocked on the second lock).
    const next = blockedOn(3);
    const waiter = db.query(`SELECT 1`);
    await first.release();
    await holder;
    await expect(waiter).rejects.toBeInstanceOf(PoolExhaustedError);
    await second.release();
    await next;
  });
});
