/**
 * The layer lifted into another app: apps/minimal-express (Express, one entity, injected TypeORM repositories,
 * the layer only through its public entry) on a database of its own, migrated by its own migrations, with
 * NODE_ENV=production. Each claim is checked in the database afterwards.
 */
import { jest } from '@jest/globals';
import { Body, Controller, Headers, type INestApplication, Logger, Module, Post, ValidationPipe } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { InjectRepository, TypeOrmModule } from '@nestjs/typeorm';
import { randomUUID } from 'node:crypto';
import { Pool } from 'pg';
import { DataSource, type Repository } from 'typeorm';
import { Idempotent } from '@idempotent-orders/idempotency';
import { AppModule } from '../apps/minimal-express/src/app.module';
import { CreateTransferDto } from '../apps/minimal-express/src/create-transfer.dto';
import { Transfer } from '../apps/minimal-express/src/transfer.entity';
import { SINGLE_TRANSFER_LIMIT_MINOR, TransfersService } from '../apps/minimal-express/src/transfers.service';
import { createTestDatabase, ignoreIdleErrors } from './support/test-app';

/** Every way TypeORM's docs teach to write, inside one @Idempotent() handler: each must join the claim's transaction. */
@Controller('typeorm-ways')
class TypeOrmWaysController {
  constructor(
    @InjectRepository(Transfer) private readonly transfers: Repository<Transfer>,
    private readonly dataSource: DataSource,
  ) {}

  @Post()
  @Idempotent()
  async create(@Headers('x-client-id') clientId: string, @Body() dto: CreateTransferDto): Promise<{ ids: string[] }> {
    const row = (amountMinor: number) => ({ clientId, toAccount: dto.toAccount, amountMinor });
    const injected = await this.transfers.save(this.transfers.create(row(dto.amountMinor)));
    const managed = await this.dataSource.manager.save(Transfer, this.dataSource.manager.create(Transfer, row(dto.amountMinor + 1)));
    const [queried] = await this.dataSource.query<{ id: string }[]>(
      `INSERT INTO transfers (client_id, to_account, amount_minor) VALUES ($1, $2, $3) RETURNING id`,
      [clientId, dto.toAccount, dto.amountMinor + 2],
    );
    // A nested transaction() is a savepoint: the inner one that throws undoes only its own write.
    const nested = await this.dataSource.transaction(async (manager) => {
      const kept = await manager.save(Transfer, manager.create(Transfer, row(dto.amountMinor + 3)));
      await manager
        .transaction(async (inner) => {
          await inner.save(Transfer, inner.create(Transfer, row(dto.amountMinor + 4)));
          throw new Error('undo the inner savepoint');
        })
        .catch(() => undefined);
      return kept;
    });
    if (dto.toAccount.startsWith('fail-after-writes-')) throw new Error('the handler fails after its writes');
    return { ids: [injected.id, managed.id, queried.id, nested.id] };
  }
}

describe('apps/minimal-express: the layer in an Express app with TypeORM repositories', () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let app: INestApplication;
  let base: string;
  let check: Pool;

  const nodeEnv = process.env.NODE_ENV;
  beforeAll(async () => {
    // As in production: nothing about joining or refusing may depend on it.
    process.env.NODE_ENV = 'production';
    database = await createTestDatabase({ empty: true });
    @Module({})
    class ProofModule {}
    app = await NestFactory.create(
      {
        module: ProofModule,
        imports: [AppModule.forRoot({ databaseUrl: database.url }), TypeOrmModule.forFeature([Transfer])],
        controllers: [TypeOrmWaysController],
      },
      { logger: ['error'] },
    );
    app.useGlobalPipes(new ValidationPipe({ whitelist: true, forbidNonWhitelisted: true }));
    await app.listen(0, '127.0.0.1');
    base = await app.getUrl();
    check = ignoreIdleErrors(new Pool({ connectionString: database.url, max: 2 }));
  });
  afterAll(async () => {
    process.env.NODE_ENV = nodeEnv;
    await check?.end();
    await app?.close();
    await database?.drop();
  });

  const post = (path: string, key: string, body: unknown, clientId = 'acme') =>
    fetch(`${base}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-client-id': clientId },
      body: JSON.stringify(body),
    });
  const transfersTo = async (account: string) =>
    (await check.query<{ n: number }>(`SELECT count(*)::int AS n FROM transfers WHERE to_account = $1`, [account])).rows[0].n;
  const keyRow = async (key: string) =>
    (
      await check.query<{ state: string; response_status: number | null }>(
        `SELECT state, response_status FROM idempotency_keys WHERE key = $1`,
        [key],
      )
    ).rows;

  it('runs on Express', () => {
    expect(app.getHttpAdapter().getType()).toBe('express');
  });

  it('20 parallel duplicates: one transfer, one recorded answer, every response the same', async () => {
    const key = randomUUID();
    const account = `acc-${randomUUID()}`;
    const responses = await Promise.all(
      Array.from({ length: 20 }, () => post('/transfers', key, { toAccount: account, amountMinor: 500 })),
    );
    const bodies = await Promise.all(responses.map((r) => r.text()));
    expect(responses.map((r) => r.status)).toEqual(Array(20).fill(201));
    expect(new Set(bodies).size).toBe(1);
    expect(responses.filter((r) => r.headers.get('idempotent-replayed') === 'true')).toHaveLength(19);
    expect(await transfersTo(account)).toBe(1);
    expect(await keyRow(key)).toEqual([{ state: 'completed', response_status: 201 }]);
    // The transfer the answer names is the row committed with the key.
    const { id } = JSON.parse(bodies[0]) as { id: string };
    const found = await fetch(`${base}/transfers/${id}`, { headers: { 'x-client-id': 'acme' } });
    expect(found.status).toBe(200);
  });

  it('an abort mid-handler, after the repository wrote: nothing committed, and the retry with the same key runs', async () => {
    const key = randomUUID();
    const account = `acc-${randomUUID()}`;
    const recorded = jest.spyOn(app.get(TransfersService), 'recorded').mockRejectedValueOnce(new Error('crashed after the save'));
    try {
      const aborted = await post('/transfers', key, { toAccount: account, amountMinor: 700 });
      expect(aborted.status).toBe(500);
      expect(aborted.headers.get('content-type')).toMatch(/^application\/problem\+json/);
      expect(await transfersTo(account)).toBe(0);
      expect(await keyRow(key)).toEqual([]);
      const retried = await post('/transfers', key, { toAccount: account, amountMinor: 700 });
      expect(retried.status).toBe(201);
      expect(retried.headers.get('idempotent-replayed')).toBeNull();
      expect(await transfersTo(account)).toBe(1);
    } finally {
      recorded.mockRestore();
    }
  });

  it('a business 4xx: stored and replayed byte for byte, the repository write before it rolled back', async () => {
    const key = randomUUID();
    const account = `acc-${randomUUID()}`;
    const body = { toAccount: account, amountMinor: SINGLE_TRANSFER_LIMIT_MINOR + 1 };
    const first = await post('/transfers', key, body);
    const firstBody = await first.text();
    expect(first.status).toBe(422);
    expect(first.headers.get('content-type')).toMatch(/^application\/problem\+json/);
    expect(JSON.parse(firstBody)).toMatchObject({ status: 422, detail: expect.stringContaining('may not exceed') });
    const replay = await post('/transfers', key, body);
    expect(replay.status).toBe(422);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(await replay.text()).toBe(firstBody);
    expect(await transfersTo(account)).toBe(0);
    expect(await keyRow(key)).toEqual([{ state: 'completed', response_status: 422 }]);
  });

  it("an injected repository, the DataSource's manager, query() and nested transaction()s all join the claim's transaction", async () => {
    const key = randomUUID();
    const account = `acc-${randomUUID()}`;
    const first = await post('/typeorm-ways', key, { toAccount: account, amountMinor: 10 });
    expect(first.status).toBe(201);
    const firstBody = await first.text();
    const replay = await post('/typeorm-ways', key, { toAccount: account, amountMinor: 10 });
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(await replay.text()).toBe(firstBody);
    const rows = await check.query<{ id: string; amount_minor: number }>(
      `SELECT id, amount_minor FROM transfers WHERE to_account = $1 ORDER BY amount_minor`,
      [account],
    );
    // Four writes, once each; the inner savepoint's (14) undone.
    expect(rows.rows.map((r) => r.amount_minor)).toEqual([10, 11, 12, 13]);
    expect(new Set(rows.rows.map((r) => r.id))).toEqual(new Set((JSON.parse(firstBody) as { ids: string[] }).ids));
    expect(await keyRow(key)).toEqual([{ state: 'completed', response_status: 201 }]);
  });

  it('a 500 after writes through every TypeORM way: none of them committed, and the retry makes each once', async () => {
    const key = randomUUID();
    const account = `fail-after-writes-${randomUUID()}`;
    const errors = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    try {
      const failed = await post('/typeorm-ways', key, { toAccount: account, amountMinor: 20 });
      expect(failed.status).toBe(500);
      expect(failed.headers.get('content-type')).toMatch(/^application\/problem\+json/);
    } finally {
      errors.mockRestore();
    }
    expect(await transfersTo(account)).toBe(0);
    expect(await keyRow(key)).toEqual([]);
    // The same key, a body that no longer fails: it is free, so it runs once.
    const retried = await post('/transfers', key, { toAccount: account, amountMinor: 20 });
    expect(retried.status).toBe(201);
    expect(await transfersTo(account)).toBe(1);
    expect(await keyRow(key)).toEqual([{ state: 'completed', response_status: 201 }]);
  });

  it("keys are the caller's: another client with the same key gets its own transfer; no caller, no claim", async () => {
    const key = randomUUID();
    const account = `acc-${randomUUID()}`;
    expect((await post('/transfers', key, { toAccount: account, amountMinor: 100 }, 'acme')).status).toBe(201);
    expect((await post('/transfers', key, { toAccount: account, amountMinor: 100 }, 'globex')).status).toBe(201);
    expect(await transfersTo(account)).toBe(2);
    const anonymous = await fetch(`${base}/transfers`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key },
      body: '{}',
    });
    expect(anonymous.status).toBe(401);
  });

  it("its one migration makes the service's table, and the layer's entity matches it", async () => {
    const service = await createTestDatabase();
    const servicePool = ignoreIdleErrors(new Pool({ connectionString: service.url, max: 1 }));
    try {
      const shape = async (pool: Pool) => ({
        columns: (
          await pool.query(
            `SELECT column_name, data_type, is_nullable, column_default FROM information_schema.columns WHERE table_schema = 'public' AND table_name = 'idempotency_keys' ORDER BY column_name`,
          )
        ).rows,
        constraints: (
          await pool.query(
            `SELECT conname, pg_get_constraintdef(oid) AS def FROM pg_constraint WHERE conrelid = 'public.idempotency_keys'::regclass ORDER BY conname`,
          )
        ).rows,
        indexes: (
          await pool.query(
            `SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename = 'idempotency_keys' ORDER BY indexname`,
          )
        ).rows,
        options: (await pool.query(`SELECT reloptions FROM pg_class WHERE oid = 'public.idempotency_keys'::regclass`)).rows,
      });
      const ours = await shape(check);
      expect(ours.columns.length).toBeGreaterThan(10);
      expect(ours).toEqual(await shape(servicePool));
    } finally {
      await servicePool.end();
      await service.drop();
    }
    const drift = await app.get(DataSource).driver.createSchemaBuilder().log();
    expect(drift.upQueries.map((q) => q.query)).toEqual([]);
  });
});
