/**
 * The layer lifted into another app: apps/minimal-express (Express, one entity, TypeORM repositories,
 * the layer only through its public entry) on a database of its own, migrated by its own migrations.
 * Each claim is checked in the database afterwards.
 */
import { jest } from '@jest/globals';
import { Body, Controller, Headers, type INestApplication, Logger, Module, Post, ValidationPipe } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { InjectRepository, TypeOrmModule } from '@nestjs/typeorm';
import { randomUUID } from 'node:crypto';
import { Pool } from 'pg';
import { DataSource, type Repository } from 'typeorm';
import { EscapingWriteError, Idempotent } from '#idempotency';
import { AppModule } from '../apps/minimal-express/src/app.module';
import { CreateTransferDto } from '../apps/minimal-express/src/create-transfer.dto';
import { Transfer } from '../apps/minimal-express/src/transfer.entity';
import { SINGLE_TRANSFER_LIMIT_MINOR, TransfersService } from '../apps/minimal-express/src/transfers.service';
import { createTestDatabase, ignoreIdleErrors } from './support/test-app';

/** The mistake the layer refuses: a handler that writes through an injected repository, on a connection of its own. */
@Controller('escaping-transfers')
class EscapingTransfersController {
  constructor(@InjectRepository(Transfer) private readonly transfers: Repository<Transfer>) {}

  @Post()
  @Idempotent()
  create(@Headers('x-client-id') clientId: string, @Body() dto: CreateTransferDto): Promise<Transfer> {
    return this.transfers.save(this.transfers.create({ clientId, ...dto }));
  }
}

describe('apps/minimal-express: the layer in an Express app with TypeORM repositories', () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let app: INestApplication;
  let base: string;
  let check: Pool;

  beforeAll(async () => {
    database = await createTestDatabase({ empty: true });
    @Module({})
    class ProofModule {}
    app = await NestFactory.create(
      { module: ProofModule, imports: [AppModule.forRoot({ databaseUrl: database.url }), TypeOrmModule.forFeature([Transfer])], controllers: [EscapingTransfersController] },
      { logger: ['error'] },
    );
    app.useGlobalPipes(new ValidationPipe({ whitelist: true, forbidNonWhitelisted: true }));
    await app.listen(0, '127.0.0.1');
    base = await app.getUrl();
    check = ignoreIdleErrors(new Pool({ connectionString: database.url, max: 2 }));
  });
  afterAll(async () => {
    await check?.end();
    await app?.close();
    await database?.drop();
  });

  const post = (path: string, key: string, body: unknown, clientId = 'acme') =>
    fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-client-id': clientId }, body: JSON.stringify(body) });
  const transfersTo = async (account: string) => (await check.query<{ n: number }>(`SELECT count(*)::int AS n FROM transfers WHERE to_account = $1`, [account])).rows[0].n;
  const keyRow = async (key: string) =>
    (await check.query<{ state: string; response_status: number | null }>(`SELECT state, response_status FROM idempotency_keys WHERE key = $1`, [key])).rows;

  it('runs on Express', () => {
    expect(app.getHttpAdapter().getType()).toBe('express');
  });

  it('20 parallel duplicates: one transfer, one recorded answer, every response the same', async () => {
    const key = randomUUID();
    const account = `acc-${randomUUID()}`;
    const responses = await Promise.all(Array.from({ length: 20 }, () => post('/transfers', key, { toAccount: account, amountMinor: 500 })));
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

  it('a write through an injected repository inside the handler: refused, nothing committed, the key free', async () => {
    const key = randomUUID();
    const account = `acc-${randomUUID()}`;
    const errors = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    try {
      const res = await post('/escaping-transfers', key, { toAccount: account, amountMinor: 300 });
      expect(res.status).toBe(500);
      const logged = errors.mock.calls.map(([first]) => (first as { err?: unknown } | undefined)?.err);
      expect(logged.some((err) => err instanceof EscapingWriteError)).toBe(true);
    } finally {
      errors.mockRestore();
    }
    expect(await transfersTo(account)).toBe(0);
    expect(await keyRow(key)).toEqual([]);
  });

  it('keys are the caller\'s: another client with the same key gets its own transfer; no caller, no claim', async () => {
    const key = randomUUID();
    const account = `acc-${randomUUID()}`;
    expect((await post('/transfers', key, { toAccount: account, amountMinor: 100 }, 'acme')).status).toBe(201);
    expect((await post('/transfers', key, { toAccount: account, amountMinor: 100 }, 'globex')).status).toBe(201);
    expect(await transfersTo(account)).toBe(2);
    const anonymous = await fetch(`${base}/transfers`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key }, body: '{}' });
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
        constraints: (await pool.query(`SELECT conname, pg_get_constraintdef(oid) AS def FROM pg_constraint WHERE conrelid = 'public.idempotency_keys'::regclass ORDER BY conname`)).rows,
        indexes: (await pool.query(`SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename = 'idempotency_keys' ORDER BY indexname`)).rows,
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
