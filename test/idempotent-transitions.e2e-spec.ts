/**
 * The Idempotency-Key layer on the state transitions (POST /orders/:id/{cancel,ship,deliver}):
 * a business 409 is stored and replayed with the headers it was first sent with; a lock timeout
 * is not an outcome, so it is not stored and the retry runs.
 */
import { randomUUID } from 'node:crypto';
import { Client } from 'pg';
import request from 'supertest';
import { ALICE, bearer, startTestApp, type TestApp } from './support/test-app';

const PROBLEM_JSON = /^application\/problem\+json/;

describe('Idempotency-Key on order transitions', () => {
  let t: TestApp;
  let numbers = 0;

  beforeAll(async () => {
    // Short, so the lock-timeout test is quick; nothing here depends on how long it is.
    t = await startTestApp({ IDEMPOTENCY_WAIT_MS: '300' });
  });
  afterAll(async () => {
    await t?.close();
  });

  async function insertOrder(status: string): Promise<string> {
    const { rows } = await t.db.query(
      `INSERT INTO orders (client_id, order_number, currency, total_minor, status) VALUES ('alice', $1, 'EUR', 100, $2) RETURNING id`,
      [`TR-${++numbers}`, status],
    );
    return rows[0].id;
  }
  const ship = (id: string, key: string) =>
    request(t.url).post(`/orders/${id}/ship`).set('Authorization', bearer(ALICE)).set('Idempotency-Key', key);
  const keyRows = async (key: string) =>
    (await t.db.query(`SELECT state, response_status FROM idempotency_keys WHERE key = $1`, [key])).rows;
  const orderRow = async (id: string) =>
    (
      await t.db.query(
        `SELECT status, version, (SELECT count(*)::int FROM order_events WHERE order_id = $1) AS events FROM orders WHERE id = $1`,
        [id],
      )
    ).rows[0];

  it('stores a refused transition (409 invalid-transition) and replays it with the same Content-Type and ETag', async () => {
    const id = await insertOrder('created');
    const key = randomUUID();
    const first = await ship(id, key);
    expect(first.status).toBe(409);
    expect(first.body).toMatchObject({ type: 'urn:idempotent-orders:problem:invalid-transition', currentStatus: 'created' });
    expect(first.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(first.headers.etag).toBe('"1"');
    expect(first.headers.location).toBeUndefined();
    expect(await keyRows(key)).toEqual([{ state: 'completed', response_status: 409 }]);

    // The order moves on; the key still answers what it answered.
    await t.db.query(`UPDATE orders SET status = 'paid', version = version + 1 WHERE id = $1`, [id]);
    const again = await ship(id, key);
    expect(again.status).toBe(409);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.text).toBe(first.text);
    expect(again.headers['content-type']).toBe(first.headers['content-type']);
    expect(again.headers.etag).toBe(first.headers.etag);
    expect(again.headers.location).toBeUndefined();
    expect(await orderRow(id)).toEqual({ status: 'paid', version: 2, events: 0 });
  });

  it('replays a keyed transition that succeeded: 200, same body and ETag, one event', async () => {
    const id = await insertOrder('paid');
    const key = randomUUID();
    const first = await ship(id, key);
    expect(first.status).toBe(200);
    expect(first.headers.etag).toBe('"2"');
    const again = await ship(id, key);
    expect(again.status).toBe(200);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.text).toBe(first.text);
    expect(again.headers['content-type']).toBe(first.headers['content-type']);
    expect(again.headers.etag).toBe(first.headers.etag);
    expect(await orderRow(id)).toEqual({ status: 'shipped', version: 2, events: 1 });
  });

  describe('while another transaction holds the order row', () => {
    let holder: Client;
    afterEach(async () => {
      await holder?.end().catch(() => undefined);
    });

    it('past lock_timeout: 409 concurrent-request with Retry-After, NOT stored; the retry after the lock is gone executes', async () => {
      const id = await insertOrder('paid');
      holder = new Client({ connectionString: t.databaseUrl });
      await holder.connect();
      await holder.query('BEGIN');
      await holder.query('SELECT id FROM orders WHERE id = $1 FOR UPDATE', [id]);

      const key = randomUUID();
      const blocked = await ship(id, key);
      expect(blocked.status).toBe(409);
      expect(blocked.headers['content-type']).toMatch(PROBLEM_JSON);
      expect(blocked.body).toMatchObject({ type: 'urn:idempotent-orders:problem:concurrent-request', status: 409 });
      expect(blocked.headers['retry-after']).toBe('1');
      expect(blocked.headers.etag).toBeUndefined();
      expect(blocked.headers['idempotent-replayed']).toBeUndefined();
      // Temporary, so not an outcome: the key is free and nothing moved.
      expect(await keyRows(key)).toEqual([]);
      expect(await orderRow(id)).toEqual({ status: 'paid', version: 1, events: 0 });

      await holder.query('ROLLBACK');
      const retried = await ship(id, key);
      expect(retried.status).toBe(200);
      expect(retried.headers['idempotent-replayed']).toBeUndefined();
      expect(retried.body.status).toBe('shipped');
      expect(await keyRows(key)).toEqual([{ state: 'completed', response_status: 200 }]);
      expect(await orderRow(id)).toEqual({ status: 'shipped', version: 2, events: 1 });
    });
  });
});
