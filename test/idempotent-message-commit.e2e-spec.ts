/**
 * @IdempotentMessage acks only what was committed. A handler that catches a database error and goes on leaves its
 * transaction aborted; PostgreSQL then answers the COMMIT with ROLLBACK — no error — and the effect and the mark are
 * both gone. Acked, that message would be lost. The interceptor runs as Nest runs it (its context, its `next`), on a
 * real PostgreSQL; the channel records what it is told.
 */
import { jest } from '@jest/globals';
import { type CallHandler, type ExecutionContext, Logger } from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { randomUUID } from 'node:crypto';
import { Pool } from 'pg';
import { from } from 'rxjs';
import { DataSource } from 'typeorm';
import { Database, IdempotencyMetrics } from '@idempotent-orders/idempotency';
import { createProcessedMessagesTable, IdempotentMessage, IdempotentMessageInterceptor } from '@idempotent-orders/idempotency/messages';
import { resolveIdempotencyOptions } from './support/idempotency-internals';
import { typeormOptions } from '../src/database/typeorm-options';
import { createTestDatabase, ignoreIdleErrors } from './support/test-app';

class Handlers {
  @IdempotentMessage({ consumer: 'commit-check' })
  applyOrder(): void {}
}

describe('@IdempotentMessage: a COMMIT answered with ROLLBACK is never acked', () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let dataSource: DataSource;
  let db: Database;
  let interceptor: IdempotentMessageInterceptor;
  let check: Pool;
  beforeAll(async () => {
    database = await createTestDatabase();
    dataSource = new DataSource(typeormOptions(database.url, { poolSize: 2 }));
    await dataSource.initialize();
    const runner = dataSource.createQueryRunner();
    await createProcessedMessagesTable(runner);
    await runner.query(`CREATE TABLE message_effects (id text PRIMARY KEY)`);
    await runner.release();
    db = new Database(dataSource, resolveIdempotencyOptions({ callerScope: () => undefined })).attach();
    interceptor = new IdempotentMessageInterceptor(new Reflector(), db, await IdempotencyMetrics.create(false));
    check = ignoreIdleErrors(new Pool({ connectionString: database.url, max: 1 }));
  });
  afterAll(async () => {
    db?.onModuleDestroy();
    await check?.end();
    await dataSource?.destroy();
    await database?.drop();
  });

  /** Delivers one message to the interceptor as Nest's RMQ transport would; resolves once it has been settled. */
  async function deliver(messageId: string, effect: () => Promise<void>) {
    const settled = { ack: jest.fn(), nack: jest.fn() };
    const message = { properties: { messageId, headers: {} } };
    const context = {
      getHandler: () => Object.getOwnPropertyDescriptor(Handlers.prototype, 'applyOrder')?.value as () => void,
      switchToRpc: () => ({ getData: () => ({}), getContext: () => ({ getMessage: () => message, getChannelRef: () => settled }) }),
    } as unknown as ExecutionContext;
    const next: CallHandler = { handle: () => from(effect()) };
    await new Promise<void>((resolve, reject) => interceptor.intercept(context, next).subscribe({ complete: resolve, error: reject }));
    return settled;
  }
  const rows = async (table: string) => (await check.query(`SELECT * FROM ${table}`)).rowCount;

  it('a handler that swallows a unique violation: sent back (nack + requeue), not acked; neither the effect nor the mark kept', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    try {
      const messageId = randomUUID();
      const channel = await deliver(messageId, async () => {
        await db.query(`INSERT INTO message_effects VALUES ($1)`, [messageId]);
        await db.query(`INSERT INTO message_effects VALUES ($1)`, [messageId]).catch(() => undefined); // 23505, swallowed
      });
      expect(channel.ack).not.toHaveBeenCalled();
      expect(channel.nack).toHaveBeenCalledWith(expect.anything(), false, true);
      expect(await rows('message_effects')).toBe(0);
      expect(await rows('processed_messages')).toBe(0);
    } finally {
      warn.mockRestore();
    }
  });

  it('a handler that commits is acked once, with its effect and its mark', async () => {
    const messageId = randomUUID();
    const channel = await deliver(messageId, async () => {
      await db.query(`INSERT INTO message_effects VALUES ($1)`, [messageId]);
    });
    expect(channel.ack).toHaveBeenCalledTimes(1);
    expect(channel.nack).not.toHaveBeenCalled();
    expect((await check.query(`SELECT id FROM message_effects WHERE id = $1`, [messageId])).rowCount).toBe(1);
  });
});
