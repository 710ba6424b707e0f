/**
 * The transaction seam under @Idempotent(): what code inside a handler can do to the claim's transaction, each case a
 * review reproduced against the layer. Through apps/minimal-express (Express, injected repositories) with
 * NODE_ENV=production, on a real PostgreSQL; every outcome is checked in the database afterwards.
 */
import { jest } from '@jest/globals';
import { Body, Controller, Headers, type INestApplication, Logger, Module, Post, ValidationPipe } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { InjectRepository, TypeOrmModule } from '@nestjs/typeorm';
import { randomUUID } from 'node:crypto';
import { Pool } from 'pg';
import { DataSource, type Repository } from 'typeorm';
import { Database, Idempotent } from '@idempotent-orders/idempotency';
import { AppModule } from '../apps/minimal-express/src/app.module';
import { CreateTransferDto } from '../apps/minimal-express/src/create-transfer.dto';
import { Transfer } from '../apps/minimal-express/src/transfer.entity';
import { createTestDatabase, ignoreIdleErrors } from './support/test-app';

/** What a handler's leftover work did once it ran: the seam must refuse it, never let it write. */
const leftovers: Promise<unknown>[] = [];
/** The outcome of each of two nested transactions started at once. */
let nestedOutcomes: PromiseSettledResult<unknown>[] = [];

@Controller('seam')
class SeamController {
  static otherPool: Pool;

  constructor(
    @InjectRepository(Transfer) private readonly transfers: Repository<Transfer>,
    private readonly dataSource: DataSource,
  ) {}

  private row(clientId: string, dto: CreateTransferDto, delta = 0) {
    return this.transfers.create({ clientId, toAccount: dto.toAccount, amountMinor: dto.amountMinor + delta });
  }

  /** Finding 1: work started in the handler that runs after its COMMIT (a timer), through the repository and query(). */
  @Post('leftover')
  @Idempotent()
  async leftover(@Headers('x-client-id') clientId: string, @Body() dto: CreateTransferDto): Promise<{ ok: true }> {
    await this.transfers.save(this.row(clientId, dto));
    const later = new Promise<void>((resolve) => setTimeout(resolve, 50));
    leftovers.push(later.then(() => this.transfers.save(this.row(clientId, dto, 1))));
    leftovers.push(
      later.then(() =>
        this.dataSource.query(`INSERT INTO transfers (client_id, to_account, amount_minor) VALUES ($1, $2, 7)`, [clientId, dto.toAccount]),
      ),
    );
    return { ok: true };
  }

  /** Finding 2: a unique violation caught and ignored: PostgreSQL answers the COMMIT with ROLLBACK. */
  @Post('swallowed')
  @Idempotent()
  async swallowed(@Headers('x-client-id') clientId: string, @Body() dto: CreateTransferDto): Promise<{ ok: true }> {
    await this.transfers.save(this.row(clientId, dto));
    await this.dataSource.query(`SELECT 1 / 0`).catch(() => undefined);
    return { ok: true };
  }

  /** Finding 3: two dataSource.transaction() calls at once. */
  @Post('parallel-nested')
  @Idempotent()
  async parallelNested(@Headers('x-client-id') clientId: string, @Body() dto: CreateTransferDto): Promise<{ ok: true }> {
    nestedOutcomes = await Promise.allSettled(
      [0, 1].map((delta) => this.dataSource.transaction((manager) => manager.save(Transfer, this.row(clientId, dto, delta)))),
    );
    return { ok: true };
  }

  /** Sequential nested transactions, the way TypeORM documents them: a savepoint each, the failing one undone alone. */
  @Post('sequential-nested')
  @Idempotent()
  async sequentialNested(@Headers('x-client-id') clientId: string, @Body() dto: CreateTransferDto): Promise<{ ok: true }> {
    await this.dataSource.transaction((manager) => manager.save(Transfer, this.row(clientId, dto)));
    await this.dataSource
      .transaction(async (manager) => {
        await manager.save(Transfer, this.row(clientId, dto, 1));
        throw new Error('undo this one');
      })
      .catch(() => undefined);
    await this.dataSource.transaction(async (manager) => {
      await manager.save(Transfer, this.row(clientId, dto, 2));
      await manager.transaction((inner) => inner.save(Transfer, this.row(clientId, dto, 3)));
    });
    return { ok: true };
  }

  /** Finding 5: a nested transaction asking for SERIALIZABLE inside the claim's READ COMMITTED one. */
  @Post('serializable')
  @Idempotent()
  async serializable(@Headers('x-client-id') clientId: string, @Body() dto: CreateTransferDto): Promise<{ ok: true }> {
    await this.dataSource.transaction('SERIALIZABLE', (manager) => manager.save(Transfer, this.row(clientId, dto)));
    return { ok: true };
  }

  /** Finding 7: TypeORM's QueryRunner recipe, failing after its commitTransaction(): the recipe's own error must surface. */
  @Post('query-runner-recipe')
  @Idempotent()
  async queryRunnerRecipe(@Headers('x-client-id') clientId: string, @Body() dto: CreateTransferDto): Promise<{ ok: true }> {
    const runner = this.dataSource.createQueryRunner();
    await runner.connect();
    await runner.startTransaction();
    try {
      await runner.manager.save(Transfer, this.row(clientId, dto));
      await runner.commitTransaction();
      if (dto.toAccount.startsWith('fail-')) throw new Error('the recipe failed after its commit');
    } catch (err) {
      await runner.rollbackTransaction();
      throw err;
    } finally {
      await runner.release();
    }
    return { ok: true };
  }

  /** Finding 4: a write of the app's own on another pool (a log table), not the claim's business: it is not refused. */
  @Post('other-pool')
  @Idempotent()
  async otherPool(@Headers('x-client-id') clientId: string, @Body() dto: CreateTransferDto): Promise<{ ok: true }> {
    await this.transfers.save(this.row(clientId, dto));
    await SeamController.otherPool.query(`INSERT INTO seam_log (note) VALUES ($1)`, [dto.toAccount]);
    const flushed = new Promise<void>((resolve) => setTimeout(resolve, 50));
    leftovers.push(
      flushed.then(() => SeamController.otherPool.query(`INSERT INTO seam_log (note) VALUES ($1)`, [`${dto.toAccount} flushed`])),
    );
    return { ok: true };
  }
}

describe('the transaction seam under @Idempotent() (NODE_ENV=production)', () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let app: INestApplication;
  let base: string;
  let check: Pool;
  const nodeEnv = process.env.NODE_ENV;

  beforeAll(async () => {
    process.env.NODE_ENV = 'production';
    database = await createTestDatabase({ empty: true });
    @Module({})
    class SeamModule {}
    app = await NestFactory.create(
      {
        module: SeamModule,
        imports: [AppModule.forRoot({ databaseUrl: database.url }), TypeOrmModule.forFeature([Transfer])],
        controllers: [SeamController],
      },
      { logger: ['error'] },
    );
    app.useGlobalPipes(new ValidationPipe({ whitelist: true, forbidNonWhitelisted: true }));
    await app.listen(0, '127.0.0.1');
    base = await app.getUrl();
    check = ignoreIdleErrors(new Pool({ connectionString: database.url, max: 2 }));
    await check.query(`CREATE TABLE seam_log (note text NOT NULL)`);
    SeamController.otherPool = ignoreIdleErrors(new Pool({ connectionString: database.url, max: 1 }));
  });
  afterAll(async () => {
    process.env.NODE_ENV = nodeEnv;
    await SeamController.otherPool?.end();
    await check?.end();
    await app?.close();
    await database?.drop();
  });
  beforeEach(() => {
    leftovers.length = 0;
    nestedOutcomes = [];
  });

  const post = (path: string, key: string, toAccount: string) =>
    fetch(`${base}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-client-id': 'acme' },
      body: JSON.stringify({ toAccount, amountMinor: 100 }),
    });
  const amountsTo = async (account: string) =>
    (
      await check.query<{ amount_minor: number }>(`SELECT amount_minor FROM transfers WHERE to_account = $1 ORDER BY amount_minor`, [
        account,
      ])
    ).rows.map((r) => Number(r.amount_minor));
  const keyRow = async (key: string) =>
    (
      await check.query<{ state: string; response_status: number }>(`SELECT state, response_status FROM idempotency_keys WHERE key = $1`, [
        key,
      ])
    ).rows;
  const idleInTransaction = async () =>
    (
      await check.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`,
      )
    ).rows[0].n;
  /** Errors the app logs (a 500's cause): silenced, and kept to look at. */
  const loggedErrors = () => jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);

  it('1: a write a handler leaves running past its COMMIT is refused with a clear error; nothing is sent on the returned connection', async () => {
    const key = randomUUID();
    const account = `leftover-${randomUUID()}`;
    const res = await post('/seam/leftover', key, account);
    expect(res.status).toBe(201);
    const outcomes = await Promise.allSettled(leftovers);
    expect(outcomes.map((o) => o.status)).toEqual(['rejected', 'rejected']);
    for (const o of outcomes) expect(String((o as PromiseRejectedResult).reason)).toMatch(/transaction this code ran in has already ended/);
    expect(await amountsTo(account)).toEqual([100]);
    expect(await idleInTransaction()).toBe(0);
    // The connections in the pool are clean: the next requests commit, and what they wrote stays.
    const next = `after-${randomUUID()}`;
    const again = await Promise.all(Array.from({ length: 12 }, () => post('/seam/sequential-nested', randomUUID(), next)));
    expect(again.map((r) => r.status)).toEqual(Array(12).fill(201));
    expect(await amountsTo(next)).toHaveLength(36);
  });

  it('2: an error caught and ignored in a handler fails the request: 500, no stored answer, nothing written, the key free', async () => {
    const key = randomUUID();
    const account = `swallowed-${randomUUID()}`;
    const errors = loggedErrors();
    try {
      const res = await post('/seam/swallowed', key, account);
      expect(res.status).toBe(500);
      expect(res.headers.get('content-type')).toMatch(/^application\/problem\+json/);
      expect(
        errors.mock.calls.some((call) =>
          call.some((part) => /current transaction is aborted|rolled back, not committed/.test(String(part))),
        ),
      ).toBe(true);
    } finally {
      errors.mockRestore();
    }
    expect(await amountsTo(account)).toEqual([]);
    expect(await keyRow(key)).toEqual([]);
  });

  it('3: two nested transactions at once: the second is refused before it sends anything, the first commits with the claim', async () => {
    const key = randomUUID();
    const account = `parallel-${randomUUID()}`;
    const res = await post('/seam/parallel-nested', key, account);
    expect(res.status).toBe(201);
    expect(nestedOutcomes.map((o) => o.status)).toEqual(['fulfilled', 'rejected']);
    expect((nestedOutcomes[1] as PromiseRejectedResult).reason).toMatchObject({ name: 'ConcurrentNestedTransactionError' });
    expect(await amountsTo(account)).toEqual([100]);
    expect(await keyRow(key)).toEqual([{ state: 'completed', response_status: 201 }]);
  });

  it('nested transactions one after another are savepoints: the failing one is undone alone, the rest commit with the claim', async () => {
    const key = randomUUID();
    const account = `sequential-${randomUUID()}`;
    expect((await post('/seam/sequential-nested', key, account)).status).toBe(201);
    expect(await amountsTo(account)).toEqual([100, 102, 103]);
    expect(await keyRow(key)).toEqual([{ state: 'completed', response_status: 201 }]);
  });

  it('5: a nested transaction asking for SERIALIZABLE is refused, never run at READ COMMITTED: nothing written, the key free', async () => {
    const key = randomUUID();
    const account = `serializable-${randomUUID()}`;
    const errors = loggedErrors();
    try {
      const res = await post('/seam/serializable', key, account);
      expect(res.status).toBe(500);
      expect(errors.mock.calls.some((call) => call.some((part) => /SERIALIZABLE cannot be granted/.test(String(part))))).toBe(true);
    } finally {
      errors.mockRestore();
    }
    expect(await amountsTo(account)).toEqual([]);
    expect(await keyRow(key)).toEqual([]);
  });

  it("7: TypeORM's QueryRunner recipe works inside a handler, and when it fails after its commit its own error is the one seen", async () => {
    const ok = `recipe-${randomUUID()}`;
    expect((await post('/seam/query-runner-recipe', randomUUID(), ok)).status).toBe(201);
    expect(await amountsTo(ok)).toEqual([100]);

    const key = randomUUID();
    const failing = `fail-${randomUUID()}`;
    const errors = loggedErrors();
    try {
      expect((await post('/seam/query-runner-recipe', key, failing)).status).toBe(500);
      const logged = errors.mock.calls.flat().map(String).join('\n');
      expect(logged).toMatch(/the recipe failed after its commit/);
      expect(logged).not.toMatch(/would end the idempotent transaction/);
    } finally {
      errors.mockRestore();
    }
    expect(await amountsTo(failing)).toEqual([]);
    expect(await keyRow(key)).toEqual([]);
  });

  it("4: the app's own writes on another pool, inside a handler and from a timer it armed, are not refused", async () => {
    const key = randomUUID();
    const account = `other-pool-${randomUUID()}`;
    expect((await post('/seam/other-pool', key, account)).status).toBe(201);
    await Promise.all(leftovers);
    const notes = (await check.query<{ note: string }>(`SELECT note FROM seam_log WHERE note LIKE $1 ORDER BY note`, [`${account}%`])).rows;
    expect(notes.map((r) => r.note)).toEqual([account, `${account} flushed`]);
    expect(await amountsTo(account)).toEqual([100]);
  });

  it('6: streams work inside a handler transaction and outside one, with the settings the how-to page gives', async () => {
    const dataSource = app.get(DataSource);
    expect((dataSource.options.extra as { pipeline?: boolean } | undefined)?.pipeline).toBeUndefined();
    const read = async () => {
      const stream = await dataSource.createQueryBuilder().select('1', 'one').from('transfers', 't').limit(2).stream();
      const rows: unknown[] = [];
      for await (const row of stream) rows.push(row);
      return rows.length;
    };
    expect(await read()).toBeGreaterThan(0);
    expect(await app.get(Database).transaction(read)).toBeGreaterThan(0);
  });
});
