/**
 * The layer attaches to the one DataSource it is given and to nothing else: pg's Client, Pool and Query prototypes and
 * TypeORM's DataSource prototype are the same before the package is imported and after an app using it started and
 * served an idempotent request; another DataSource of the same process keeps its own createQueryRunner; closing the
 * app gives the attached one its own back. Only pg and TypeORM are imported statically, so the snapshot is taken
 * before anything of the layer has loaded (the rest is imported inside beforeAll).
 */
import type { INestApplication } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { DataSource } from 'typeorm';

/** Every own property of a prototype, by value (or getter): a wrap or a replacement shows as a different function. */
const snapshot = (proto: object) =>
  new Map(
    Reflect.ownKeys(proto).map((key) => {
      const { value, get } = Object.getOwnPropertyDescriptor(proto, key)! as { value?: unknown; get?: unknown };
      return [key, value ?? get] as const;
    }),
  );
const PROTOTYPES: Record<string, object> = {
  'pg.Client.prototype': pg.Client.prototype,
  'pg.Pool.prototype': pg.Pool.prototype,
  'pg-pool Pool.prototype': Object.getPrototypeOf(pg.Pool.prototype) as object,
  'pg.Query.prototype': pg.Query.prototype,
  'typeorm DataSource.prototype': DataSource.prototype,
};
const before = new Map(Object.entries(PROTOTYPES).map(([name, proto]) => [name, snapshot(proto)]));
/** "name.key" of every property added, removed or replaced since `before`. */
const changed = () =>
  Object.entries(PROTOTYPES).flatMap(([name, proto]) => {
    const [was, now] = [before.get(name)!, snapshot(proto)];
    const keys = new Set([...was.keys(), ...now.keys()]);
    return [...keys].filter((key) => was.get(key) !== now.get(key)).map((key) => `${name}.${String(key)}`);
  });

describe('the layer patches nothing global', () => {
  let app: INestApplication | undefined;
  let other: DataSource | undefined;
  let drop: (() => Promise<void>) | undefined;
  afterAll(async () => {
    await app?.close();
    await other?.destroy();
    await drop?.();
  });

  it('after import, start and an idempotent request: prototypes untouched, only the given DataSource attached, detached on close', async () => {
    const { createTestDatabase } = await import('./support/test-app');
    const { NestFactory } = await import('@nestjs/core');
    const { AppModule } = await import('../apps/minimal-express/src/app.module');
    const database = await createTestDatabase({ empty: true });
    drop = () => database.drop();
    app = await NestFactory.create(AppModule.forRoot({ databaseUrl: database.url }), { logger: ['error'] });
    await app.listen(0, '127.0.0.1');
    other = await new DataSource({ type: 'postgres', url: database.url }).initialize();

    const res = await fetch(`${await app.getUrl()}/transfers`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': randomUUID(), 'x-client-id': 'acme' },
      body: JSON.stringify({ toAccount: 'DE-1', amountMinor: 100 }),
    });
    expect(res.status).toBe(201);
    await other.query('SELECT 1');

    expect(changed()).toEqual([]);
    const given = app.get(DataSource);
    expect(Object.hasOwn(given, 'createQueryRunner')).toBe(true);
    expect(Object.hasOwn(other, 'createQueryRunner')).toBe(false);

    await app.close();
    app = undefined;
    expect(Object.hasOwn(given, 'createQueryRunner')).toBe(false);
    expect(changed()).toEqual([]);
  });
});
