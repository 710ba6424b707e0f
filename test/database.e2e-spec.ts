/**
 * Database: statements sent together (BEGIN with the first statement; deferred statements with the
 * next one or the COMMIT) must mean exactly what sending them one by one means. On a real PostgreSQL.
 */
import { DataSource } from 'typeorm';
import { Database } from '../src/database/database.service';
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
    dataSource = new DataSource(typeormOptions(database.url, { lockTimeoutMs: 2_000, poolSize: 2 }));
    await dataSource.initialize();
    db = new Database(dataSource);
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
});
