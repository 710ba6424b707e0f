import { randomUUID } from 'node:crypto';
import { Client } from 'pg';
import request from 'supertest';
import { IdempotencyKeyReaper } from '../src/idempotency/idempotency-key-reaper';
import { ALICE, BOB, bearer, startTestApp, type TestApp } from './support/test-app';

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

describe('Idempotency-Key on POST /orders', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp({ IDEMPOTENCY_WAIT_MS: '400' });
  });
  afterAll(async () => {
    await t?.close();
  });

  const post = (key: string | undefined, body: unknown, client = ALICE) => {
    const req = request(t.url).post('/orders').set('Authorization', bearer(client));
    if (key !== undefined) void req.set('Idempotency-Key', key);
    return req.send(body as object);
  };
  const count = async (sql: string, params: unknown[] = []) => (await t.db.query(sql, params)).rows[0].n as number;
  const ordersWithNote = (note: string) => count(`SELECT count(*)::int AS n FROM orders WHERE note = $1`, [note]);
  const keyRows = (key: string) => t.db.query(`SELECT client_id, state, response_status FROM idempotency_keys WHERE key = $1 ORDER BY client_id`, [key]);
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
    for (const bad of ['', 'a b', 'x'.repeat(256), '"unterminated', 'ключ']) {
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

  it('replays the first response byte for byte, with Location and ETag, and executes once', async () => {
    const key = randomUUID();
    const first = await post(key, order({ note: 'replay' }));
    expect(first.status).toBe(201);
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    const again = await post(key, order({ note: 'replay' }));
    expect(again.status).toBe(201);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.text).toBe(first.text);
    expect(again.headers['content-type']).toBe(first.headers['content-type']);
    expect(again.headers.location).toBe(first.headers.location);
    expect(again.headers.etag).toBe(first.headers.etag);
    expect(again.headers['set-cookie']).toBeUndefined();
    // The RFC 8941 quoted form names the same key.
    const quoted = await post(`"${key}"`, order({ note: 'replay' }));
    expect(quoted.headers['idempotent-replayed']).toBe('true');
    expect(quoted.text).toBe(first.text);
    expect(await ordersWithNote('replay')).toBe(1);
    expect((await keyRows(key)).rows).toEqual([{ client_id: 'alice', state: 'completed', response_status: 201 }]);
  });

  it('fingerprints meaning, not spelling: reordered keys and whitespace replay', async () => {
    const key = randomUUID();
    const first = await request(t.url).post('/orders').set('Authorization', bearer(ALICE)).set('Idempotency-Key', key)
      .set('Content-Type', 'application/json').send('{"currency":"EUR","note":"spelling","items":[{"sku":"S","quantity":1,"unitPriceMinor":1}]}');
    const second = await request(t.url).post('/orders').set('Authorization', bearer(ALICE)).set('Idempotency-Key', key)
      .set('Content-Type', 'application/json').send('{ "items": [ {"unitPriceMinor": 1, "quantity": 1, "sku": "S"} ],\n "note": "spelling", "currency": "EUR" }');
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
    const cancel = await request(t.url).post(`/orders/${created.body.id}/cancel`).set('Authorization', bearer(ALICE)).set('Idempotency-Key', key);
    expect(cancel.status).toBe(422);
    expect(cancel.body.title).toBe('Idempotency-Key is already used');
    const { rows } = await t.db.query('SELECT status FROM orders WHERE id = $1', [created.body.id]);
    expect(rows[0].status).toBe('created');
  });

  it('replays a transition made under a key, even after the order moved on', async () => {
    const created = await post(randomUUID(), order({ note: 'transition-key' }));
    const key = randomUUID();
    const cancel = () => request(t.url).post(`/orders/${created.body.id}/cancel`).set('Authorization', bearer(ALICE)).set('Idempotency-Key', key);
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
    await t.db.query(`CREATE FUNCTION probe_write() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO probe_writes VALUES (NEW.note); RETURN NEW; END $$`);
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

  it('duplicates arriving at one process wait in memory, not on pooled connections blocked on the key', async () => {
    // The first request is slow (a trigger sleeps 300 ms inside its insert), so the others arrive while it runs.
    await t.db.query(`CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.3); RETURN NEW; END $$`);
    await t.db.query(`CREATE TRIGGER slow_insert BEFORE INSERT ON orders FOR EACH ROW WHEN (NEW.note = 'slow-storm') EXECUTE FUNCTION slow_insert()`);
    try {
      const key = randomUUID();
      const waitedBefore = await metric('waited');
      const first = post(key, order({ note: 'slow-storm' })).then((r) => r);
      await until(async () => (await count(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND query LIKE '%pg_sleep%' AND state = 'active'`)) > 0, 'the first request is inside its insert');
      const duplicates = Promise.all(Array.from({ length: 30 }, () => post(key, order({ note: 'slow-storm' })).then((r) => r)));
      let maxLockWaiters = 0;
      let done = false;
      void duplicates.finally(() => (done = true));
      while (!done) {
        maxLockWaiters = Math.max(maxLockWaiters, await count(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`));
      }
      const responses = [await first, ...(await duplicates)];
      expect(maxLockWaiters).toBe(0);
      expect(responses.map((r) => r.status)).toEqual(Array(31).fill(201));
      expect(new Set(responses.map((r) => r.text)).size).toBe(1);
      expect(await ordersWithNote('slow-storm')).toBe(1);
      expect(await metric('waited')).toBe(waitedBefore + 30);
    } finally {
      await t.db.query('DROP TRIGGER slow_insert ON orders; DROP FUNCTION slow_insert()');
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
    const hold = async (key: string, body: unknown) => {
      holder = new Client({ connectionString: t.databaseUrl });
      // One test kills this connection on purpose.
      holder.on('error', () => undefined);
      await holder.connect();
      await holder.query('BEGIN');
      // Exactly what an in-flight request has done: claimed the key, not yet committed.
      const { fingerprintRequest } = await import('../src/idempotency/request-fingerprint');
      await holder.query(
        `INSERT INTO idempotency_keys (client_id, key, fingerprint, request_method, request_path, expires_at)
         VALUES ('alice', $1, $2, 'POST', '/orders', now() + interval '1 day')`,
        [key, fingerprintRequest('POST', '/orders', body)],
      );
    };
    const waitingOnLock = () =>
      until(async () => (await count(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)) > 0, 'a request waits on the key');
    afterEach(async () => {
      await holder?.end().catch(() => undefined);
    });

    it('a duplicate waits, then replays what the first request committed', async () => {
      const key = randomUUID();
      const body = order({ note: 'held' });
      await hold(key, body);
      const before = await metric('waited');
      const pending = post(key, body).then((r) => r);
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
      expect(await ordersWithNote('held')).toBe(0);
      expect(await metric('waited')).toBe(before + 1);
      expect((await request(t.url).get('/metrics')).text).toMatch(/idempotency_wait_seconds_count \d+/);
    });

    it('past IDEMPOTENCY_WAIT_MS a duplicate gets 409 with Retry-After, and nothing runs', async () => {
      const key = randomUUID();
      const body = order({ note: 'outstanding' });
      await hold(key, body);
      const started = Date.now();
      const res = await post(key, body);
      expect(res.status).toBe(409);
      expect(res.headers['retry-after']).toBe('1');
      expect(res.body).toMatchObject({ title: 'A request is outstanding for this Idempotency-Key', status: 409 });
      expect(Date.now() - started).toBeGreaterThanOrEqual(350);
      await holder.query('ROLLBACK');
      expect(await ordersWithNote('outstanding')).toBe(0);
    });

    it('when the first request dies, the duplicate takes the key over and runs: no stuck key', async () => {
      const key = randomUUID();
      const body = order({ note: 'orphaned' });
      await hold(key, body);
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
  });

  it('does not store a 5xx: the transaction rolls back and the key is free for the retry', async () => {
    await t.db.query(`CREATE FUNCTION fail_once() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'disk on fire'; END $$`);
    await t.db.query(`CREATE TRIGGER fail_once BEFORE INSERT ON orders FOR EACH ROW WHEN (NEW.note = 'five-hundred') EXECUTE FUNCTION fail_once()`);
    const key = randomUUID();
    try {
      const failed = await post(key, order({ note: 'five-hundred' }));
      expect(failed.status).toBe(500);
      expect(failed.body).toEqual({ type: 'about:blank', title: 'Internal Server Error', status: 500, detail: expect.stringContaining('X-Request-Id') });
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
});
