/**
 * An online migration, as a rolling deploy runs it: columns added to and dropped from the hot tables
 * while creates, pays, refunds and reads go on in parallel. With named prepared statements (the
 * default), a statement whose result follows a table's column list would fail on every connection
 * that prepared it (0A000) until the connection was recycled. The bar is zero answers ≥ 500,
 * during and after.
 */
import { randomUUID } from 'node:crypto';
import { Client } from 'pg';
import request from 'supertest';
import { PG, pgErrorCode } from '@idempotent-orders/idempotency';
import { ALICE, bearer, ignoreIdleErrors, startTestApp, type TestApp } from './support/test-app';
import { DDL_LOCK_TIMEOUT_MS } from '#service-kit';

const HOT_TABLES = ['orders', 'payments', 'idempotency_keys', 'refunds'];
/** Answers the service gives after each schema change before the next one: every worker has run against it. */
const ANSWERS_PER_STEP = 30;
const WORKERS = 3;

describe('online migration: ADD COLUMN and DROP COLUMN on the hot tables while serving', () => {
  let t: TestApp;
  let ddl: Client;
  beforeAll(async () => {
    t = await startTestApp({ RECONCILE_INTERVAL_MS: '0', PSP_WEBHOOK_URL: 'none' });
    ddl = ignoreIdleErrors(new Client({ connectionString: t.databaseUrl }));
    await ddl.connect();
  });
  afterAll(async () => {
    await ddl?.end();
    await t?.close();
  });

  /** As the migration runner runs DDL: a short lock_timeout, tried again while the table's lock stays taken. */
  async function alter(sql: string): Promise<void> {
    for (let attempt = 1; ; attempt++) {
      try {
        await ddl.query(`BEGIN; SET LOCAL lock_timeout = ${DDL_LOCK_TIMEOUT_MS}; ${sql}; COMMIT`);
        return;
      } catch (err) {
        await ddl.query('ROLLBACK');
        if (pgErrorCode(err) !== PG.lockNotAvailable || attempt >= 20) throw err;
      }
    }
  }

  it('answers nothing ≥ 500, and every write it acknowledged is in the database', async () => {
    const failures: string[] = [];
    const statuses = new Map<string, number>();
    const created: string[] = [];
    const paid: string[] = [];
    const refunded: string[] = [];
    let answers = 0;
    let stop = false;

    const send = async (what: string, req: request.Test): Promise<request.Response> => {
      const res = await req;
      answers++;
      statuses.set(`${what} ${res.status}`, (statuses.get(`${what} ${res.status}`) ?? 0) + 1);
      if (res.status >= 500) failures.push(`${what}: ${res.status} ${JSON.stringify(res.body)}`);
      return res;
    };
    const post = (path: string, body: object, key: string = randomUUID()) =>
      request(t.url).post(path).set('Authorization', bearer(ALICE)).set('Idempotency-Key', key).send(body);
    const get = (path: string) => request(t.url).get(path).set('Authorization', bearer(ALICE));

    /** One customer's round: create (and replay the create), read, pay, read the payment, cancel, refund, read the refunds. */
    async function round(): Promise<void> {
      const key = randomUUID();
      const body = { currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 2, unitPriceMinor: 1250 }] };
      const order = await send('create', post('/orders', body, key));
      if (order.status !== 201) return;
      const orderId = order.body.id as string;
      created.push(orderId);
      await send('replay', post('/orders', body, key));
      await send('read order', get(`/orders/${orderId}`));
      const payment = await send('pay', post(`/orders/${orderId}/payments`, { source: 'tok_visa' }));
      if (payment.status !== 201) return;
      const paymentId = payment.body.id as string;
      paid.push(paymentId);
      await send('read payment', get(`/payments/${paymentId}`));
      await send('list payments', get(`/orders/${orderId}/payments`));
      const cancelled = await send('cancel', request(t.url).post(`/orders/${orderId}/cancel`).set('Authorization', bearer(ALICE)));
      if (cancelled.status !== 200) return;
      const refund = await send('refund', post(`/payments/${paymentId}/refunds`, {}));
      if (refund.status === 201) refunded.push(refund.body.id as string);
      await send('list refunds', get(`/payments/${paymentId}/refunds`));
    }
    const workers = Array.from({ length: WORKERS }, async () => {
      while (!stop) await round();
    });

    /** Polls until the service has given `count` more answers (every worker has been served since the change). */
    const answered = async (count: number) => {
      const target = answers + count;
      const deadline = Date.now() + 30_000;
      while (answers < target) {
        if (Date.now() > deadline) throw new Error(`only ${answers - target + count} answers in 30 s`);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    };

    try {
      // Every pooled connection in use has prepared the hot statements before the first change.
      await answered(ANSWERS_PER_STEP * 2);
      for (const table of HOT_TABLES) {
        await alter(`ALTER TABLE ${table} ADD COLUMN online_probe text`);
        await answered(ANSWERS_PER_STEP);
        await alter(`ALTER TABLE ${table} ADD COLUMN online_probe_counter int NOT NULL DEFAULT 0`);
        await answered(ANSWERS_PER_STEP);
        await alter(`ALTER TABLE ${table} DROP COLUMN online_probe`);
        await answered(ANSWERS_PER_STEP);
        await alter(`ALTER TABLE ${table} DROP COLUMN online_probe_counter`);
        await answered(ANSWERS_PER_STEP);
      }
    } finally {
      stop = true;
      await Promise.all(workers);
    }

    expect(failures).toEqual([]);
    // The traffic really was there: every kind of request succeeded, across the changes.
    const kinds = [
      'create 201',
      'replay 201',
      'read order 200',
      'pay 201',
      'read payment 200',
      'list payments 200',
      'refund 201',
      'list refunds 200',
    ];
    expect(kinds.filter((kind) => !statuses.get(kind))).toEqual([]);
    const count = async (sql: string, ids: string[]) => (await t.db.query<{ n: number }>(sql, [ids])).rows[0].n;
    expect(await count(`SELECT count(*)::int AS n FROM orders WHERE id = ANY($1::uuid[])`, created)).toBe(created.length);
    expect(await count(`SELECT count(*)::int AS n FROM payments WHERE id = ANY($1::uuid[]) AND status = 'succeeded'`, paid)).toBe(
      paid.length,
    );
    expect(await count(`SELECT count(*)::int AS n FROM refunds WHERE id = ANY($1::uuid[]) AND status = 'succeeded'`, refunded)).toBe(
      refunded.length,
    );
    // No key was left unfinished by a request that failed half-way.
    expect((await t.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM idempotency_keys WHERE state = 'in_progress'`)).rows[0].n).toBe(
      0,
    );
  });
});
