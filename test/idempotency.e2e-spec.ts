import { jest } from '@jest/globals';
import { Body, Controller, HttpCode, type INestApplication, Logger, Module, Post, Res } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import type { FastifyReply as Response } from 'fastify';
import { randomUUID } from 'node:crypto';
import { Client, Pool } from 'pg';
import request from 'supertest';
import { AppModule } from '../src/app.module';
import { createHttpApp } from '../src/http-app';
import { fingerprintRequest, Idempotent } from '@idempotent-orders/idempotency';
import { IdempotencyKeyReaper } from './support/idempotency-internals';
import { ALICE, BOB, bearer, createTestDatabase, startTestApp, testConfig, type TestApp } from './support/test-app';

const order = (overrides: Record<string, unknown> = {}) => ({
  currency: 'EUR',
  items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 1000 }],
  ...overrides,
});

/** Polls `check` until it is true or the deadline passes: synchronisation without sleeps. */
async function until(check: () => Promise<boolean>, what: string, deadlineMs = 5_000): Promise<void> {
  const deadline = Date.now() + deadlineMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** The service's own connections (application_name) waiting on a lock, now. */
const LOCK_WAITERS = `SELECT count(*)::int AS n FROM pg_stat_activity
  WHERE datname = current_database() AND application_name = 'idempotent-orders' AND wait_event_type = 'Lock'`;

/** What a request in flight holds of its key until it commits: the key's transaction-scoped advisory lock. */
const HOLD_KEY = `SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))`;

/** A transaction of the test's own, holding what a request will need until the test says so. */
async function openHolder(databaseUrl: string): Promise<Client> {
  const holder = new Client({ connectionString: databaseUrl });
  // One test kills this connection on purpose.
  holder.on('error', () => undefined);
  await holder.connect();
  await holder.query('BEGIN');
  return holder;
}

/** Reads one unlabelled sample from /metrics. */
async function sample(url: string, name: string): Promise<number> {
  const text = (await request(url).get('/metrics')).text;
  const line = text.split('\n').find((l) => l.startsWith(`${name} `));
  if (!line) throw new Error(`no ${name} in /metrics`);
  return Number(line.split(' ')[1]);
}

/** A create on `t`, with `key` as its Idempotency-Key (none when undefined). */
function postOrder(t: TestApp, key: string | undefined, body: unknown, client = ALICE) {
  const req = request(t.url).post('/orders').set('Authorization', bearer(client));
  if (key !== undefined) void req.set('Idempotency-Key', key);
  return req.send(body as object);
}

const countOrdersWithNote = async (t: TestApp, note: string) =>
  (await t.db.query(`SELECT count(*)::int AS n FROM orders WHERE note = $1`, [note])).rows[0].n as number;

describe('Idempotency-Key on POST /orders', () => {
  let t: TestApp;
  beforeAll(async () => {
    // Long: the tests below release what they hold as soon as they have seen it held, so no request
    // should ever reach this bound; a loaded machine cannot make one fail. The bound itself is tested
    // on the short-wait app at the end of this file.
    t = await startTestApp({ IDEMPOTENCY_WAIT_MS: '20000' });
  });
  afterAll(async () => {
    await t?.close();
  });

  const post = (key: string | undefined, body: unknown, client = ALICE) => postOrder(t, key, body, client);
  const count = async (sql: string, params: unknown[] = []) => (await t.db.query(sql, params)).rows[0].n as number;
  const ordersWithNote = (note: string) => countOrdersWithNote(t, note);
  const keyRows = (key: string) =>
    t.db.query(`SELECT client_id, state, response_status FROM idempotency_keys WHERE key = $1 ORDER BY client_id`, [key]);
  const metric = async (outcome: string) => {
    const text = (await request(t.url).get('/metrics')).text;
    const line = text.split('\n').find((l) => l.startsWith(`idempotency_requests_total{outcome="${outcome}"}`));
    return line ? Number(line.split(' ')[1]) : 0;
  };

  it('requires the key (400, nothing written) and rejects a malformed one', async () => {
    const missing = await post(undefined, order({ note: 'no-key' }));
    expect(missing.status).toBe(400);
    expect(missing.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(missing.body).toMatchObject({ title: 'Idempotency-Key is missing', status: 400 });
    for (const bad of ['', 'a b', '"a b"', 'x'.repeat(256), '"unterminated', 'ключ']) {
      const res = await request(t.url)
        .post('/orders')
        .set('Authorization', bearer(ALICE))
        .set('Idempotency-Key', Buffer.from(bad, 'utf8').toString('latin1'))
        .send(order({ note: 'no-key' }));
      expect(res.status).toBe(400);
      expect(res.body.type).toBe('urn:idempotent-orders:problem:idempotency-key-malformed');
    }
    expect(await ordersWithNote('no-key')).toBe(0);
    expect(await metric('missing')).toBe(1);
  });

  it('logs the create guard\'s "missing" outcome as the interceptor logs its own, with the client', async () => {
    const log = jest.spyOn(Logger.prototype, 'log');
    // The test app runs at LOG_LEVEL=silent, where the line is not even built: Nest's levels as at LOG_LEVEL=info.
    Logger.overrideLogger(['fatal', 'error', 'warn', 'log']);
    try {
      const missing = await post(undefined, order({ note: 'no-key-logged' }));
      expect(missing.status).toBe(400);
      expect(log).toHaveBeenCalledWith('idempotency missing: client alice, key -');
    } finally {
      Logger.overrideLogger([]);
      log.mockRestore();
    }
  });

  it('replays the first response byte for byte, with Location and ETag, and executes once', async () => {
    const key = randomUUID();
    const first = await post(key, order({ note: 'replay' }));
    expect(first.status).toBe(201);
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    const again = await post(key, order({ note: 'replay' }));
    expect(again.status).toBe(201);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.text).toBe(first.text);
    expect(first.headers.location).toMatch(/^\/orders\//);
    expect(first.headers.etag).toBe('"1"');
    expect(again.headers['content-type']).toBe(first.headers['content-type']);
    expect(again.headers.location).toBe(first.headers.location);
    expect(again.headers.etag).toBe(first.headers.etag);
    // The RFC 8941 quoted form names the same key.
    const quoted = await post(`"${key}"`, order({ note: 'replay' }));
    expect(quoted.headers['idempotent-replayed']).toBe('true');
    expect(quoted.text).toBe(first.text);
    expect(await ordersWithNote('replay')).toBe(1);
    expect((await keyRows(key)).rows).toEqual([{ client_id: 'alice', state: 'completed', response_status: 201 }]);
  });

  it('fingerprints meaning, not spelling: reordered keys and whitespace replay', async () => {
    const key = randomUUID();
    const first = await request(t.url)
      .post('/orders')
      .set('Authorization', bearer(ALICE))
      .set('Idempotency-Key', key)
      .set('Content-Type', 'application/json')
      .send('{"currency":"EUR","note":"spelling","items":[{"sku":"S","quantity":1,"unitPriceMinor":1}]}');
    const second = await request(t.url)
      .post('/orders')
      .set('Authorization', bearer(ALICE))
      .set('Idempotency-Key', key)
      .set('Content-Type', 'application/json')
      .send('{ "items": [ {"unitPriceMinor": 1, "quantity": 1, "sku": "S"} ],\n "note": "spelling", "currency": "EUR" }');
    expect(first.status).toBe(201);
    expect(second.status).toBe(201);
    expect(second.headers['idempotent-replayed']).toBe('true');
    expect(await ordersWithNote('spelling')).toBe(1);
  });

  it('answers 422 for the same key with another body, and executes nothing', async () => {
    const key = randomUUID();
    expect((await post(key, order({ note: 'mismatch-1' }))).status).toBe(201);
    const other = await post(key, order({ note: 'mismatch-2' }));
    expect(other.status).toBe(422);
    expect(other.body).toMatchObject({ title: 'Idempotency-Key is already used', status: 422 });
    expect(await ordersWithNote('mismatch-2')).toBe(0);
    expect(await metric('mismatch')).toBeGreaterThanOrEqual(1);
  });

  it('answers 422 for the same key on another endpoint, and runs nothing there', async () => {
    const key = randomUUID();
    const created = await post(key, order({ note: 'other-endpoint' }));
    expect(created.status).toBe(201);
    const cancel = await request(t.url)
      .post(`/orders/${created.body.id}/cancel`)
      .set('Authorization', bearer(ALICE))
      .set('Idempotency-Key', key);
    expect(cancel.status).toBe(422);
    expect(cancel.body.title).toBe('Idempotency-Key is already used');
    const { rows } = await t.db.query('SELECT status FROM orders WHERE id = $1', [created.body.id]);
    expect(rows[0].status).toBe('created');
  });

  it('replays a transition made under a key, even after the order moved on', async () => {
    const created = await post(randomUUID(), order({ note: 'transition-key' }));
    const key = randomUUID();
    const cancel = () =>
      request(t.url).post(`/orders/${created.body.id}/cancel`).set('Authorization', bearer(ALICE)).set('Idempotency-Key', key);
    const first = await cancel();
    expect(first.status).toBe(200);
    expect(first.body.status).toBe('cancelled');
    await t.db.query(`UPDATE orders SET status = 'refunded', version = version + 1 WHERE id = $1`, [created.body.id]);
    const again = await cancel();
    expect(again.status).toBe(200);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.text).toBe(first.text);
    expect(again.headers.etag).toBe(first.headers.etag);
  });

  it('does not burn the key on a validation failure: the corrected request runs', async () => {
    const key = randomUUID();
    const invalid = await post(key, order({ note: 'fixed', currency: 'EURO' }));
    expect(invalid.status).toBe(400);
    expect((await keyRows(key)).rows).toEqual([]);
    const fixed = await post(key, order({ note: 'fixed' }));
    expect(fixed.status).toBe(201);
    expect(fixed.headers['idempotent-replayed']).toBeUndefined();
  });

  it('stores a business 409 and replays it, even after the conflict has gone', async () => {
    const number = `PO-${randomUUID()}`;
    const original = await post(randomUUID(), order({ orderNumber: number, note: 'original' }));
    expect(original.status).toBe(201);
    const key = randomUUID();
    const conflict = await post(key, order({ orderNumber: number, note: 'different' }));
    expect(conflict.status).toBe(409);
    expect(conflict.body).toMatchObject({ type: 'urn:idempotent-orders:problem:order-number-conflict', orderId: original.body.id });
    await t.db.query('DELETE FROM orders WHERE id = $1', [original.body.id]);
    const replay = await post(key, order({ orderNumber: number, note: 'different' }));
    expect(replay.status).toBe(409);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.headers['content-type']).toBe(conflict.headers['content-type']);
    expect(replay.text).toBe(conflict.text);
    expect(await ordersWithNote('different')).toBe(0);
  });

  it('a stored business 4xx keeps none of the writes the handler made before it failed (savepoint)', async () => {
    // A trigger writes a row on every attempted order insert, even one ON CONFLICT turns into a 409.
    await t.db.query(`CREATE TABLE probe_writes (note text)`);
    await t.db.query(
      `CREATE FUNCTION probe_write() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO probe_writes VALUES (NEW.note); RETURN NEW; END $$`,
    );
    await t.db.query(`CREATE TRIGGER probe_write BEFORE INSERT ON orders FOR EACH ROW EXECUTE FUNCTION probe_write()`);
    try {
      const number = `PO-${randomUUID()}`;
      expect((await post(randomUUID(), order({ orderNumber: number, note: 'probe-original' }))).status).toBe(201);
      const key = randomUUID();
      const conflict = await post(key, order({ orderNumber: number, note: 'probe-conflict' }));
      expect(conflict.status).toBe(409);
      expect((await keyRows(key)).rows).toEqual([{ client_id: 'alice', state: 'completed', response_status: 409 }]);
      const { rows } = await t.db.query(`SELECT note FROM probe_writes ORDER BY note`);
      expect(rows).toEqual([{ note: 'probe-original' }]);
    } finally {
      await t.db.query('DROP TRIGGER probe_write ON orders; DROP FUNCTION probe_write(); DROP TABLE probe_writes');
    }
  });

  it('keeps two clients apart: the same key is two independent keys', async () => {
    const key = randomUUID();
    const a = await post(key, order({ note: 'alice-k' }), ALICE);
    const b = await post(key, order({ note: 'bob-k', currency: 'USD' }), BOB);
    expect([a.status, b.status]).toEqual([201, 201]);
    expect(b.headers['idempotent-replayed']).toBeUndefined();
    expect(b.body.id).not.toBe(a.body.id);
    const bobReplay = await post(key, order({ note: 'bob-k', currency: 'USD' }), BOB);
    expect(bobReplay.text).toBe(b.text);
    expect((await keyRows(key)).rows.map((r) => r.client_id)).toEqual(['alice', 'bob']);
  });

  it('20 parallel identical requests execute once; every answer is the same 201 or a 409 with Retry-After', async () => {
    const key = randomUUID();
    const responses = await Promise.all(Array.from({ length: 20 }, () => post(key, order({ note: 'storm' }))));
    const created = responses.filter((r) => r.status === 201);
    const busy = responses.filter((r) => r.status === 409);
    expect(created.length + busy.length).toBe(20);
    expect(created.length).toBeGreaterThanOrEqual(1);
    expect(new Set(created.map((r) => r.text)).size).toBe(1);
    expect(created.filter((r) => r.headers['idempotent-replayed'] !== 'true')).toHaveLength(1);
    for (const r of busy) expect(r.headers['retry-after']).toBe('1');
    expect(await ordersWithNote('storm')).toBe(1);
    expect((await keyRows(key)).rows).toEqual([{ client_id: 'alice', state: 'completed', response_status: 201 }]);
  });

  /** Holds an uncommitted order with this number: a create with it waits on the row, deterministically. */
  const holdOrderNumber = async (number: string) => {
    const holder = await openHolder(t.databaseUrl);
    await holder.query(`INSERT INTO orders (client_id, order_number, currency, total_minor) VALUES ('alice', $1, 'EUR', 1)`, [number]);
    return holder;
  };
  const waiting = () => sample(t.url, 'idempotency_waiting_requests');

  it('duplicates arriving at one process wait in memory, not on pooled connections blocked on the key', async () => {
    const number = `PO-${randomUUID()}`;
    const body = order({ orderNumber: number, note: 'held-storm' });
    const holder = await holdOrderNumber(number);
    try {
      const key = randomUUID();
      const waitedBefore = await metric('waited');
      const first = post(key, body).then((r) => r);
      await until(async () => (await count(LOCK_WAITERS)) === 1, 'the first request waits on the held order number');
      const duplicates = Promise.all(Array.from({ length: 30 }, () => post(key, body).then((r) => r)));
      await until(async () => (await waiting()) === 30, 'all 30 duplicates wait in memory');
      // Still only the first is at the database: the 30 hold no pooled connection.
      expect(await count(LOCK_WAITERS)).toBe(1);
      await holder.query('ROLLBACK');
      const responses = [await first, ...(await duplicates)];
      expect(responses.map((r) => r.status)).toEqual(Array(31).fill(201));
      expect(new Set(responses.map((r) => r.text)).size).toBe(1);
      expect(responses.filter((r) => r.headers['idempotent-replayed'] !== 'true')).toHaveLength(1);
      expect(await ordersWithNote('held-storm')).toBe(1);
      expect(await metric('waited')).toBe(waitedBefore + 30);
      expect(await waiting()).toBe(0);
    } finally {
      await holder.end();
    }
  });

  it('when the first request fails, the waiters go one at a time: the next claims, the rest stay in memory', async () => {
    const number = `PO-${randomUUID()}`;
    const body = order({ orderNumber: number, note: 'queue-after-failure' });
    const holder = await holdOrderNumber(number);
    try {
      const key = randomUUID();
      const first = post(key, body).then((r) => r);
      await until(async () => (await count(LOCK_WAITERS)) === 1, 'the first request waits on the held order number');
      const [{ pid }] = (
        await t.db.query(
          `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'idempotent-orders' AND wait_event_type = 'Lock'`,
        )
      ).rows;
      const duplicates = Promise.all(Array.from({ length: 4 }, () => post(key, body).then((r) => r)));
      await until(async () => (await waiting()) === 4, 'the 4 duplicates wait in memory');
      // The first request fails (its statement is cancelled): a 500, the key is free again.
      await t.db.query('SELECT pg_cancel_backend($1)', [pid]);
      expect((await first).status).toBe(500);
      // The next in line claims the key and waits on the held order number in its turn ...
      await until(async () => (await count(LOCK_WAITERS)) >= 1, 'the next request waits on the held order number');
      // ... while the other three are still queued in memory, not on the key's row lock.
      expect(await waiting()).toBe(3);
      expect(await count(LOCK_WAITERS)).toBe(1);
      await holder.query('ROLLBACK');
      const responses = await duplicates;
      expect(responses.map((r) => r.status)).toEqual([201, 201, 201, 201]);
      expect(responses.filter((r) => r.headers['idempotent-replayed'] !== 'true')).toHaveLength(1);
      expect(new Set(responses.map((r) => r.text)).size).toBe(1);
      expect(await ordersWithNote('queue-after-failure')).toBe(1);
    } finally {
      await holder.end();
    }
  });

  it('parallel requests with one key and different bodies execute exactly one of them', async () => {
    const key = randomUUID();
    const responses = await Promise.all(Array.from({ length: 12 }, (_, i) => post(key, order({ note: `race-${i}` }))));
    const statuses = responses.map((r) => r.status);
    expect(statuses.every((s) => s === 201 || s === 422 || s === 409)).toBe(true);
    const executed = await count(`SELECT count(*)::int AS n FROM orders WHERE note LIKE 'race-%'`);
    expect(executed).toBe(1);
    const winner = responses.find((r) => r.status === 201 && r.headers['idempotent-replayed'] === undefined);
    expect(winner).toBeDefined();
    expect(statuses.filter((s) => s === 201)).toHaveLength(1);
  });

  describe('while another request holds the key (its transaction still open)', () => {
    let holder: Client;
    const hold = async (key: string) => {
      holder = await openHolder(t.databaseUrl);
      // Exactly what an in-flight request has done: taken the key's lock, written nothing yet.
      await holder.query(HOLD_KEY, ['alice', key]);
    };
    /** What the in-flight request commits: the key's row, completed with its answer. */
    const completeHeld = async (key: string, body: unknown) => {
      await holder.query(
        `INSERT INTO idempotency_keys (client_id, key, fingerprint, request_method, request_path, state, response_status, completed_at,
                                       response_headers, response_body, expires_at)
         VALUES ('alice', $1, $2, 'POST', '/orders', 'completed', 201, now(),
                 '{"content-type":"application/json; charset=utf-8"}', '{"stored":true}', now() + interval '1 day')`,
        [key, fingerprintRequest('POST', '/orders', body)],
      );
      await holder.query('COMMIT');
    };
    const waitingOnLock = () => until(async () => (await count(LOCK_WAITERS)) > 0, 'a request waits on the key');
    afterEach(async () => {
      await holder?.end().catch(() => undefined);
    });

    it('a duplicate waits, then replays what the first request committed', async () => {
      const key = randomUUID();
      const body = order({ note: 'held' });
      await hold(key);
      const before = await metric('waited');
      const pending = post(key, body).then((r) => r);
      await waitingOnLock();
      await completeHeld(key, body);
      const res = await pending;
      expect(res.status).toBe(201);
      expect(res.text).toBe('{"stored":true}');
      expect(res.headers['idempotent-replayed']).toBe('true');
      expect(await ordersWithNote('held')).toBe(0);
      expect(await metric('waited')).toBe(before + 1);
      expect((await request(t.url).get('/metrics')).text).toMatch(/idempotency_wait_seconds_count \d+/);
    });

    it('when the first request dies, the duplicate takes the key over and runs: no stuck key', async () => {
      const key = randomUUID();
      const body = order({ note: 'orphaned' });
      await hold(key);
      const pending = post(key, body).then((r) => r);
      await waitingOnLock();
      // The holder's connection drops mid-transaction, as when its process is killed.
      await t.db.query('SELECT pg_terminate_backend($1)', [(holder as unknown as { processID: number }).processID]);
      const res = await pending;
      expect(res.status).toBe(201);
      expect(res.headers['idempotent-replayed']).toBeUndefined();
      expect(await ordersWithNote('orphaned')).toBe(1);
      expect((await keyRows(key)).rows).toEqual([{ client_id: 'alice', state: 'completed', response_status: 201 }]);
    });

    it('a key an older build claimed the old way (its row inserted, uncommitted): the duplicate never commits a second effect, and replays', async () => {
      const key = randomUUID();
      const body = order({ note: 'old-build' });
      holder = await openHolder(t.databaseUrl);
      // An older process's claim during a rolling deploy: it inserts the row first and takes no advisory lock.
      await holder.query(
        `INSERT INTO idempotency_keys (client_id, key, fingerprint, request_method, request_path, expires_at)
         VALUES ('alice', $1, $2, 'POST', '/orders', now() + interval '1 day')`,
        [key, fingerprintRequest('POST', '/orders', body)],
      );
      const pending = post(key, body).then((r) => r);
      // The duplicate ran its handler; its key row waits on the old claim's uncommitted one.
      await waitingOnLock();
      await holder.query(
        `UPDATE idempotency_keys SET state = 'completed', response_status = 201, completed_at = now(),
           response_headers = '{"content-type":"application/json; charset=utf-8"}', response_body = '{"stored":true}'
         WHERE key = $1`,
        [key],
      );
      await holder.query('COMMIT');
      const res = await pending;
      expect(res.status).toBe(201);
      expect(res.text).toBe('{"stored":true}');
      expect(res.headers['idempotent-replayed']).toBe('true');
      expect(await ordersWithNote('old-build')).toBe(0);
    });
  });

  it('does not store a 5xx: the transaction rolls back and the key is free for the retry', async () => {
    await t.db.query(`CREATE FUNCTION fail_once() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'disk on fire'; END $$`);
    await t.db.query(
      `CREATE TRIGGER fail_once BEFORE INSERT ON orders FOR EACH ROW WHEN (NEW.note = 'five-hundred') EXECUTE FUNCTION fail_once()`,
    );
    const key = randomUUID();
    try {
      const failed = await post(key, order({ note: 'five-hundred' }));
      expect(failed.status).toBe(500);
      expect(failed.body).toEqual({
        type: 'about:blank',
        title: 'Internal Server Error',
        status: 500,
        detail: expect.stringContaining('X-Request-Id'),
      });
      expect(failed.text).not.toContain('disk on fire');
      expect((await keyRows(key)).rows).toEqual([]);
    } finally {
      await t.db.query('DROP TRIGGER fail_once ON orders; DROP FUNCTION fail_once()');
    }
    const retried = await post(key, order({ note: 'five-hundred' }));
    expect(retried.status).toBe(201);
    expect(await ordersWithNote('five-hundred')).toBe(1);
  });

  it('treats an expired key as absent at once, and the reaper deletes expired keys in batches', async () => {
    const key = randomUUID();
    expect((await post(key, order({ note: 'ttl-1' }))).status).toBe(201);
    await t.db.query(`UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = $1`, [key]);
    const reused = await post(key, order({ note: 'ttl-2' }));
    expect(reused.status).toBe(201);
    expect(reused.headers['idempotent-replayed']).toBeUndefined();
    expect(await ordersWithNote('ttl-2')).toBe(1);

    await t.db.query(
      `INSERT INTO idempotency_keys (client_id, key, fingerprint, request_method, request_path, state, response_status, response_body, completed_at, expires_at)
       SELECT 'alice', 'old-' || g, 'f', 'POST', '/orders', 'completed', 201, '{}', now(), now() - interval '1 hour'
         FROM generate_series(1, 1200) g`,
    );
    const live = await count(`SELECT count(*)::int AS n FROM idempotency_keys WHERE expires_at > now()`);
    const reaped = await t.app.get(IdempotencyKeyReaper).reapExpiredKeys();
    expect(reaped).toBe(1200);
    expect(await count(`SELECT count(*)::int AS n FROM idempotency_keys WHERE expires_at <= now()`)).toBe(0);
    expect(await count(`SELECT count(*)::int AS n FROM idempotency_keys`)).toBe(live);
  });

  it('an error response never carries the Location or ETag of a write that was rolled back (record or commit failed)', async () => {
    // Recording the response (the key row's insert, or its update after a take-over) fails for one key, and the commit fails for another (a
    // deferred check).
    await t.db.query(
      `CREATE FUNCTION refuse_key() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused %', NEW.key; END $$`,
    );
    await t.db.query(
      `CREATE TRIGGER refuse_record BEFORE INSERT OR UPDATE ON idempotency_keys FOR EACH ROW WHEN (NEW.key LIKE 'fail-record-%' AND NEW.state = 'completed') EXECUTE FUNCTION refuse_key()`,
    );
    await t.db.query(
      `CREATE CONSTRAINT TRIGGER refuse_commit AFTER INSERT OR UPDATE ON idempotency_keys DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.key LIKE 'fail-commit-%') EXECUTE FUNCTION refuse_key()`,
    );
    try {
      for (const key of [`fail-record-${randomUUID()}`, `fail-commit-${randomUUID()}`]) {
        const failed = await post(key, order({ note: key }));
        expect(failed.status).toBe(500);
        expect(failed.headers['content-type']).toMatch(/^application\/problem\+json/);
        expect(failed.headers.location).toBeUndefined();
        expect(failed.headers.etag).toBeUndefined();
        expect(await ordersWithNote(key)).toBe(0);
        expect((await keyRows(key)).rows).toEqual([]);
      }
    } finally {
      await t.db.query(
        'DROP TRIGGER refuse_record ON idempotency_keys; DROP TRIGGER refuse_commit ON idempotency_keys; DROP FUNCTION refuse_key()',
      );
    }
  });

  const insertKey = (key: string, body: unknown, state: 'in_progress' | 'completed', expiresAt: string) =>
    t.db.query(
      `INSERT INTO idempotency_keys (client_id, key, fingerprint, request_method, request_path, state, recovery_point, locked_until,
                                     response_status, response_headers, response_body, completed_at, expires_at)
       VALUES ('alice', $1, $2, 'POST', '/orders', $3, $4, $5, $6, $7, $8, $9, ${expiresAt})`,
      state === 'completed'
        ? [
            key,
            fingerprintRequest('POST', '/orders', body),
            state,
            'started',
            null,
            201,
            { 'content-type': 'application/json; charset=utf-8' },
            '{"old":true}',
            new Date(),
          ]
        : [
            key,
            fingerprintRequest('POST', '/orders', body),
            state,
            'provider_called',
            new Date(Date.now() + 60_000),
            null,
            null,
            null,
            null,
          ],
    );
  const fullKeyRow = async (key: string) => (await t.db.query(`SELECT * FROM idempotency_keys WHERE key = $1`, [key])).rows;

  it('never takes over an unfinished key past its TTL (a phased handler under its lease): 409 + Retry-After, row unchanged', async () => {
    const key = randomUUID();
    const body = order({ note: 'phased-expired' });
    await insertKey(key, body, 'in_progress', `now() - interval '1 second'`);
    const before = await fullKeyRow(key);
    const res = await post(key, body);
    expect(res.status).toBe(409);
    expect(res.headers['retry-after']).toBe('1');
    expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:idempotency-key-in-use' });
    expect(await fullKeyRow(key)).toEqual(before);
    expect(await ordersWithNote('phased-expired')).toBe(0);
    // Whatever the body: the key is not free until its holder completes it.
    expect((await post(key, order({ note: 'phased-expired-other' }))).status).toBe(409);
    expect(await fullKeyRow(key)).toEqual(before);
  });

  it('a key that keeps changing hands during one claim is a 409 + Retry-After, never a 500', async () => {
    // Every take-over of this key matches nothing, as when other requests keep taking it first.
    await t.db.query(`CREATE FUNCTION skip_update() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`);
    await t.db.query(
      `CREATE TRIGGER skip_update BEFORE UPDATE ON idempotency_keys FOR EACH ROW WHEN (OLD.key LIKE 'contended-%') EXECUTE FUNCTION skip_update()`,
    );
    try {
      const key = `contended-${randomUUID()}`;
      const body = order({ note: 'contended' });
      await insertKey(key, body, 'completed', `now() - interval '1 second'`);
      const res = await post(key, body);
      expect(res.status).toBe(409);
      expect(res.headers['retry-after']).toBe('1');
      expect(await ordersWithNote('contended')).toBe(0);
    } finally {
      await t.db.query('DROP TRIGGER skip_update ON idempotency_keys; DROP FUNCTION skip_update()');
    }
  });

  it('two instances racing to take over one expired key: exactly one executes, the other replays it; the reaper skips the key meanwhile', async () => {
    const second = await createHttpApp({ config: testConfig(t.databaseUrl, { IDEMPOTENCY_WAIT_MS: '20000' }), databaseUrl: t.databaseUrl });
    await second.listen(0, '127.0.0.1');
    const secondUrl = `http://127.0.0.1:${(second.getHttpServer().address() as { port: number }).port}`;
    const number = `PO-${randomUUID()}`;
    const body = order({ orderNumber: number, note: 'take-over-race' });
    const key = randomUUID();
    await insertKey(key, body, 'completed', `now() - interval '1 second'`);
    const holder = await holdOrderNumber(number);
    try {
      // A takes the key over and then waits on the held order number, its take-over uncommitted ...
      const a = post(key, body).then((r) => r);
      await until(async () => (await count(LOCK_WAITERS)) === 1, 'the first take-over runs the handler');
      // ... B, on the other instance, tries to take it over too and waits on A's row lock.
      const b = request(secondUrl)
        .post('/orders')
        .set('Authorization', bearer(ALICE))
        .set('Idempotency-Key', key)
        .send(body)
        .then((r) => r);
      await until(async () => (await count(LOCK_WAITERS)) === 2, 'the second take-over waits on the key row');
      // The key is expired as far as a reaper can see, but taken: SKIP LOCKED leaves it alone.
      await t.app.get(IdempotencyKeyReaper).reapExpiredKeys();
      expect((await keyRows(key)).rows).toHaveLength(1);
      await holder.query('ROLLBACK');
      const [ra, rb] = [await a, await b];
      expect([ra.status, rb.status]).toEqual([201, 201]);
      expect(ra.headers['idempotent-replayed']).toBeUndefined();
      expect(rb.headers['idempotent-replayed']).toBe('true');
      expect(rb.text).toBe(ra.text);
      expect(await ordersWithNote('take-over-race')).toBe(1);
      expect((await keyRows(key)).rows).toEqual([{ client_id: 'alice', state: 'completed', response_status: 201 }]);
    } finally {
      await holder.end();
      await second.close();
    }
  });

  it('the reaper deleting a key while a claim waits on it: the claim then takes the key and runs, once', async () => {
    const key = randomUUID();
    const body = order({ note: 'reaped-while-claimed' });
    await insertKey(key, body, 'completed', `now() - interval '1 second'`);
    // What a reaper run does to this key, held open.
    const reaper = await openHolder(t.databaseUrl);
    try {
      await reaper.query(`DELETE FROM idempotency_keys WHERE key = $1`, [key]);
      const pending = post(key, body).then((r) => r);
      await until(async () => (await count(LOCK_WAITERS)) === 1, 'the claim waits on the row being reaped');
      await reaper.query('COMMIT');
      const res = await pending;
      expect(res.status).toBe(201);
      expect(res.headers['idempotent-replayed']).toBeUndefined();
      expect(await ordersWithNote('reaped-while-claimed')).toBe(1);
      expect((await keyRows(key)).rows).toEqual([{ client_id: 'alice', state: 'completed', response_status: 201 }]);
    } finally {
      await reaper.end();
    }
  });
});

/** What no production route does, so the layer's own guarantees can be tested: a cookie, and a handler that waits for the test. */
const probe = {
  runs: 0,
  gate: Promise.resolve(),
  release: (): void => undefined,
};
/** From now on the gated handler waits until the test calls probe.release(). */
function closeGate(): void {
  probe.gate = new Promise<void>((resolve) => (probe.release = resolve));
}

@Controller('probe')
class ProbeController {
  @Post('cookie')
  @HttpCode(201)
  @Idempotent()
  setCookie(@Res({ passthrough: true }) res: Response): { session: string } {
    const session = randomUUID();
    // A cookie as any framework writes it (no @fastify/cookie needed).
    res.header('Set-Cookie', `session=${session}; Path=/; HttpOnly`).header('Location', `/probe/${session}`);
    return { session };
  }

  @Post('gated')
  @HttpCode(200)
  @Idempotent()
  async gated(@Body() body: unknown): Promise<{ run: number; body: unknown }> {
    const run = ++probe.runs;
    await probe.gate;
    return { run, body };
  }
}

@Module({})
class ProbeAppModule {
  static forRoot(url: string) {
    // Short: this app tests the bound itself.
    const config = testConfig(url, { IDEMPOTENCY_WAIT_MS: '300' });
    return { module: ProbeAppModule, imports: [AppModule.forRoot({ config, databaseUrl: url })], controllers: [ProbeController] };
  }
}

describe('Idempotency-Key: replayed headers and the bound on waiting (test-only routes, IDEMPOTENCY_WAIT_MS=300)', () => {
  let app: INestApplication;
  let url: string;
  let db: Pool;
  let database: { url: string; drop(): Promise<void> };
  beforeAll(async () => {
    database = await createTestDatabase();
    db = new Pool({ connectionString: database.url, max: 2 });
    app = await NestFactory.create(ProbeAppModule.forRoot(database.url), new FastifyAdapter(), { logger: false });
    await app.listen(0, '127.0.0.1');
    url = `http://127.0.0.1:${(app.getHttpServer().address() as { port: number }).port}`;
  });
  afterAll(async () => {
    await app?.close();
    await db?.end();
    await database?.drop();
  });
  const call = (path: string, key: string, body: object = {}) =>
    request(url).post(path).set('Authorization', bearer(ALICE)).set('Idempotency-Key', key).send(body);

  it('never replays Set-Cookie: the handler set one, the replay carries only the stored headers', async () => {
    const key = randomUUID();
    const first = await call('/probe/cookie', key);
    expect(first.status).toBe(201);
    expect(first.headers['set-cookie']).toEqual([expect.stringMatching(/^session=/)]);
    const again = await call('/probe/cookie', key);
    expect(again.status).toBe(201);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.text).toBe(first.text);
    expect(again.headers.location).toBe(first.headers.location);
    expect(again.headers['set-cookie']).toBeUndefined();
    const { rows } = await db.query(`SELECT response_headers FROM idempotency_keys WHERE key = $1`, [key]);
    expect(Object.keys(rows[0].response_headers).sort()).toEqual(['content-type', 'location']);
  });

  it('a duplicate waiting in memory gives up at IDEMPOTENCY_WAIT_MS: 409 + Retry-After, without touching the database', async () => {
    closeGate();
    try {
      const key = randomUUID();
      const runsBefore = probe.runs;
      const first = call('/probe/gated', key, { n: 1 }).then((r) => r);
      await until(() => Promise.resolve(probe.runs === runsBefore + 1), 'the first request is inside the handler');
      const duplicate = await call('/probe/gated', key, { n: 1 });
      expect(duplicate.status).toBe(409);
      expect(duplicate.headers['retry-after']).toBe('1');
      expect(duplicate.body).toMatchObject({ type: 'urn:idempotent-orders:problem:idempotency-key-in-use' });
      // The first is still held at the gate, and the duplicate never ran nor waited on the key's row.
      expect(probe.runs).toBe(runsBefore + 1);
      expect((await db.query(LOCK_WAITERS)).rows[0].n).toBe(0);
      probe.release();
      const done = await first;
      expect(done.status).toBe(200);
      const replay = await call('/probe/gated', key, { n: 1 });
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.text).toBe(done.text);
      expect(probe.runs).toBe(runsBefore + 1);
    } finally {
      probe.release();
    }
  });

  it("a duplicate waiting on another instance's key in flight gets 409 + Retry-After at IDEMPOTENCY_WAIT_MS, and nothing runs", async () => {
    const key = randomUUID();
    const body = { currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 1000 }], note: 'outstanding' };
    const holder = await openHolder(database.url);
    try {
      await holder.query(HOLD_KEY, ['alice', key]);
      const res = await call('/orders', key, body);
      expect(res.status).toBe(409);
      expect(res.headers['retry-after']).toBe('1');
      expect(res.body).toMatchObject({ title: 'A request is outstanding for this Idempotency-Key', status: 409 });
    } finally {
      await holder.query('ROLLBACK');
      await holder.end();
    }
    expect((await db.query(`SELECT count(*)::int AS n FROM orders WHERE note = 'outstanding'`)).rows[0].n).toBe(0);
  });
});

describe('Idempotency-Key: replays answered from memory (ReplayCache, IDEMPOTENCY_TTL_SECONDS=3)', () => {
  let t: TestApp;
  // Short-lived keys, so the test can watch one expire: the cache must let go of it first.
  beforeAll(async () => (t = await startTestApp({ IDEMPOTENCY_TTL_SECONDS: '3' })));
  afterAll(async () => {
    await t?.close();
  });
  const post = (key: string, body: unknown, client = ALICE) => postOrder(t, key, body, client);
  const ordersWithNote = (note: string) => countOrdersWithNote(t, note);

  it('a replayed key is answered again from memory, byte for byte, even with its row gone', async () => {
    const key = randomUUID();
    const first = await post(key, order({ note: 'cached' }));
    expect(first.status).toBe(201);
    const replayed = await post(key, order({ note: 'cached' })); // read from the database, then remembered
    expect(replayed.headers['idempotent-replayed']).toBe('true');
    // Only memory can answer now: nothing in production deletes a live completed key, the test does.
    await t.db.query(`DELETE FROM idempotency_keys WHERE key = $1`, [key]);
    const fromMemory = await post(key, order({ note: 'cached' }));
    expect(fromMemory.status).toBe(201);
    expect(fromMemory.headers['idempotent-replayed']).toBe('true');
    expect(fromMemory.text).toBe(first.text);
    expect(fromMemory.headers.location).toBe(first.headers.location);
    expect(fromMemory.headers.etag).toBe(first.headers.etag);
    expect(await ordersWithNote('cached')).toBe(1);
  });

  it("from memory too: another body is refused (422), and another client's same key is its own", async () => {
    const key = randomUUID();
    expect((await post(key, order({ note: 'cached-scope' }))).status).toBe(201);
    expect((await post(key, order({ note: 'cached-scope' }))).headers['idempotent-replayed']).toBe('true');
    await t.db.query(`DELETE FROM idempotency_keys WHERE key = $1`, [key]);
    const other = await post(key, order({ note: 'cached-scope-other' }));
    expect(other.status).toBe(422);
    expect(other.body.type).toBe('urn:idempotent-orders:problem:idempotency-key-reused');
    const bob = await post(key, order({ note: 'cached-scope' }), BOB);
    expect(bob.status).toBe(201);
    expect(bob.headers['idempotent-replayed']).toBeUndefined();
    expect(await ordersWithNote('cached-scope')).toBe(2);
    expect(await ordersWithNote('cached-scope-other')).toBe(0);
  });

  it('lets go of a key before it expires: once expired, the key is taken over by a new request', async () => {
    const key = randomUUID();
    expect((await post(key, order({ note: 'cached-ttl-1' }))).status).toBe(201);
    expect((await post(key, order({ note: 'cached-ttl-1' }))).headers['idempotent-replayed']).toBe('true');
    await until(
      async () =>
        (await t.db.query(`SELECT expires_at <= now() AS expired FROM idempotency_keys WHERE key = $1`, [key])).rows[0].expired === true,
      'the key has expired in the database',
    );
    const reused = await post(key, order({ note: 'cached-ttl-2' }));
    expect(reused.status).toBe(201);
    expect(reused.headers['idempotent-replayed']).toBeUndefined();
    expect(await ordersWithNote('cached-ttl-2')).toBe(1);
  });
});
