import request from 'supertest';
import { ORDER_STATUSES } from '../src/orders/order-status';
import { canTransition } from '../src/orders/order-state-machine';
import { ALICE, BOB, bearer, startTestApp, type TestApp } from './support/test-app';

const PROBLEM_JSON = /^application\/problem\+json/;
const ADDRESS = { name: 'Ada Lovelace', line1: '12 St James Square', city: 'London', postalCode: 'SW1Y 4JH', country: 'GB' };

describe('order lifecycle: transitions, history, optimistic locking', () => {
  let t: TestApp;
  let numbers = 0;

  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(async () => {
    await t?.close();
  });

  /** Orders are made with SQL: these tests are about what happens to an order after it exists, in any status. */
  async function insertOrder(status = 'created', clientId = ALICE.clientId): Promise<string> {
    const { rows } = await t.db.query(
      `INSERT INTO orders (client_id, order_number, currency, total_minor, status, note) VALUES ($1, $2, 'EUR', 4498, $3, 'first note') RETURNING id`,
      [clientId, `LC-${++numbers}`, status],
    );
    return rows[0].id;
  }

  async function stored(id: string) {
    const { rows } = await t.db.query(
      `SELECT status, version, note, shipping_address, updated_at,
              (SELECT count(*)::int FROM order_events e WHERE e.order_id = o.id) AS events
         FROM orders o WHERE id = $1`,
      [id],
    );
    return rows[0];
  }

  const move = (id: string, action: 'cancel' | 'ship' | 'deliver', client = ALICE) =>
    request(t.url).post(`/orders/${id}/${action}`).set('Authorization', bearer(client));
  const read = (id: string, client = ALICE) => request(t.url).get(`/orders/${id}`).set('Authorization', bearer(client));
  const events = (id: string, client = ALICE) => request(t.url).get(`/orders/${id}/events`).set('Authorization', bearer(client));
  const patch = (id: string, body: unknown, ifMatch?: string, client = ALICE) => {
    const req = request(t.url).patch(`/orders/${id}`).set('Authorization', bearer(client));
    if (ifMatch !== undefined) req.set('If-Match', ifMatch);
    return req.send(body as object);
  };

  function expectInvalidTransition(res: request.Response, currentStatus: string, allowedTransitions: string[]) {
    expect(res.status).toBe(409);
    expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
    expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:invalid-transition', status: 409, currentStatus });
    expect(res.body.allowedTransitions).toEqual(allowedTransitions);
  }

  describe('transitions', () => {
    it('cancels a created order: 200 with the order as GET shows it, new ETag, one history row', async () => {
      const id = await insertOrder();
      const res = await move(id, 'cancel');
      expect(res.status).toBe(200);
      expect(res.headers.etag).toBe('"2"');
      expect(res.body).toMatchObject({ id, status: 'cancelled', version: 2, totalMinor: 4498, items: [] });
      const get = await read(id);
      expect(get.body).toEqual(res.body);
      expect(get.headers.etag).toBe('"2"');
      const history = await events(id);
      expect(history.status).toBe(200);
      expect(history.body).toEqual([
        { id: expect.any(String), orderId: id, fromStatus: 'created', toStatus: 'cancelled', createdAt: expect.any(String) },
      ]);
      expect(new Date(history.body[0].createdAt).toISOString()).toBe(history.body[0].createdAt);
      expect(await stored(id)).toMatchObject({ status: 'cancelled', version: 2, events: 1 });
    });

    it('repeating the transition the order already made is a 200 that writes nothing', async () => {
      const id = await insertOrder();
      expect((await move(id, 'cancel')).status).toBe(200);
      const before = await stored(id);
      const again = await move(id, 'cancel');
      expect(again.status).toBe(200);
      expect(again.headers.etag).toBe('"2"');
      expect(again.body).toMatchObject({ id, status: 'cancelled', version: 2 });
      const after = await stored(id);
      expect(after).toEqual(before);
      expect(after).toMatchObject({ version: 2, events: 1 });
    });

    it('15 concurrent cancels of one order: all 200, one history row, the version bumped exactly once', async () => {
      const id = await insertOrder();
      const responses = await Promise.all(Array.from({ length: 15 }, () => move(id, 'cancel')));
      expect(responses.map((r) => r.status)).toEqual(Array(15).fill(200));
      for (const res of responses) {
        expect(res.body).toMatchObject({ id, status: 'cancelled', version: 2 });
        expect(res.headers.etag).toBe('"2"');
      }
      expect(await stored(id)).toMatchObject({ status: 'cancelled', version: 2, events: 1 });
      const { rows } = await t.db.query('SELECT from_status, to_status FROM order_events WHERE order_id = $1', [id]);
      expect(rows).toEqual([{ from_status: 'created', to_status: 'cancelled' }]);
    });

    it('ship from created is a 409 with currentStatus and allowedTransitions, and changes nothing', async () => {
      const id = await insertOrder();
      const res = await move(id, 'ship');
      expectInvalidTransition(res, 'created', ['paid', 'cancelled']);
      expect(res.headers.etag).toBe('"1"');
      expect(await stored(id)).toMatchObject({ status: 'created', version: 1, events: 0 });
      expectInvalidTransition(await move(id, 'deliver'), 'created', ['paid', 'cancelled']);
    });

    it('ships a paid order, then delivers it; delivered is final; the history is in order', async () => {
      const id = await insertOrder('paid');
      const shipped = await move(id, 'ship');
      expect(shipped.status).toBe(200);
      expect(shipped.body).toMatchObject({ status: 'shipped', version: 2 });
      expectInvalidTransition(await move(id, 'cancel'), 'shipped', ['delivered']);
      const delivered = await move(id, 'deliver');
      expect(delivered.status).toBe(200);
      expect(delivered.body).toMatchObject({ status: 'delivered', version: 3 });
      expect(delivered.headers.etag).toBe('"3"');
      expect((await move(id, 'deliver')).body).toMatchObject({ status: 'delivered', version: 3 });
      expectInvalidTransition(await move(id, 'cancel'), 'delivered', []);
      expectInvalidTransition(await move(id, 'ship'), 'delivered', []);
      const history = await events(id);
      expect(history.body.map((e: { fromStatus: string; toStatus: string }) => [e.fromStatus, e.toStatus])).toEqual([
        ['paid', 'shipped'],
        ['shipped', 'delivered'],
      ]);
      expect(history.body[0].createdAt <= history.body[1].createdAt).toBe(true);
      expect(await stored(id)).toMatchObject({ status: 'delivered', version: 3, events: 2 });
    });

    it('cancels a paid order, recording paid → cancelled', async () => {
      const id = await insertOrder('paid');
      const res = await move(id, 'cancel');
      expect(res.status).toBe(200);
      expect(res.body).toMatchObject({ status: 'cancelled', version: 2 });
      expect((await events(id)).body).toEqual([expect.objectContaining({ fromStatus: 'paid', toStatus: 'cancelled' })]);
      // A cancelled order may only be refunded.
      expectInvalidTransition(await move(id, 'ship'), 'cancelled', ['refunded']);
    });

    it('refunded is final', async () => {
      const id = await insertOrder('refunded');
      for (const action of ['cancel', 'ship', 'deliver'] as const) expectInvalidTransition(await move(id, action), 'refunded', []);
      expect(await stored(id)).toMatchObject({ status: 'refunded', version: 1, events: 0 });
    });

    it('records the status the UPDATE replaced, even when another transaction changed it while the cancel waited', async () => {
      const id = await insertOrder();
      const other = await t.db.connect();
      try {
        await other.query('BEGIN');
        await other.query(`UPDATE orders SET status = 'paid', version = version + 1 WHERE id = $1`, [id]);
        // The cancel's snapshot still says created; it must wait for the row lock, then see paid. (The
        // service's own connections are the ones named idempotent-orders; this test's are not.)
        const cancel = move(id, 'cancel').then((res) => res);
        let waiting = 0;
        for (let polls = 0; waiting === 0 && polls < 100_000; polls++) {
          const { rows } = await t.db.query(
            `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND application_name = 'idempotent-orders'`,
          );
          waiting = rows[0].n;
        }
        expect(waiting).toBe(1);
        await other.query('COMMIT');
        const res = await cancel;
        expect(res.status).toBe(200);
        expect(res.body).toMatchObject({ status: 'cancelled', version: 3 });
      } finally {
        other.release();
      }
      const { rows } = await t.db.query('SELECT from_status, to_status FROM order_events WHERE order_id = $1', [id]);
      expect(rows).toEqual([{ from_status: 'paid', to_status: 'cancelled' }]);
    });

    it("another client's order, or an id that cannot exist, is a 404 and is left alone", async () => {
      const id = await insertOrder();
      for (const target of [id, 'not-a-uuid', '00000000-0000-4000-8000-000000000000']) {
        for (const res of [
          await move(target, 'cancel', BOB),
          await move(target, 'ship', BOB),
          await move(target, 'deliver', BOB),
          await events(target, BOB),
        ]) {
          expect(res.status).toBe(404);
          expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
          expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:order-not-found', status: 404 });
        }
      }
      expect(await stored(id)).toMatchObject({ status: 'created', version: 1, events: 0 });
    });
  });

  describe('history', () => {
    it('is an empty list for an order that never changed status', async () => {
      const id = await insertOrder();
      const res = await events(id);
      expect(res.status).toBe(200);
      expect(res.body).toEqual([]);
    });

    it("accepts exactly the state machine's moves (ck_order_events_transition)", async () => {
      const id = await insertOrder();
      for (const from of ORDER_STATUSES) {
        for (const to of ORDER_STATUSES) {
          const inserted = await t.db
            .query('INSERT INTO order_events (order_id, from_status, to_status) VALUES ($1, $2, $3)', [id, from, to])
            .then(
              () => true,
              (err: { code?: string; constraint?: string }) => {
                expect(err).toMatchObject({ code: '23514', constraint: 'ck_order_events_transition' });
                return false;
              },
            );
          expect([from, to, inserted]).toEqual([from, to, canTransition(from, to)]);
        }
      }
      expect((await stored(id)).events).toBe(6);
    });
  });

  describe('PATCH with If-Match', () => {
    it('changes the note and address at the version read: 200, new version and ETag, no history row', async () => {
      const id = await insertOrder();
      const res = await patch(id, { note: 'ring twice', shippingAddress: ADDRESS }, '"1"');
      expect(res.status).toBe(200);
      expect(res.headers.etag).toBe('"2"');
      expect(res.body).toMatchObject({ id, version: 2, note: 'ring twice', shippingAddress: ADDRESS, status: 'created' });
      expect((await read(id)).body).toEqual(res.body);
      expect(await stored(id)).toMatchObject({ version: 2, note: 'ring twice', shipping_address: ADDRESS, events: 0 });
    });

    it('leaves an absent field as it is, and clears the note with null', async () => {
      const id = await insertOrder('paid');
      const address = await patch(id, { shippingAddress: ADDRESS }, '"1"');
      expect(address.status).toBe(200);
      expect(address.body).toMatchObject({ note: 'first note', shippingAddress: ADDRESS, version: 2 });
      const cleared = await patch(id, { note: null }, '"2"');
      expect(cleared.status).toBe(200);
      expect(cleared.body).toMatchObject({ note: null, shippingAddress: ADDRESS, version: 3 });
      expect(await stored(id)).toMatchObject({ note: null, shipping_address: ADDRESS, version: 3 });
    });

    it('a stale If-Match is a 412 with the current ETag, and nothing changes', async () => {
      const id = await insertOrder();
      expect((await patch(id, { note: 'second' }, '"1"')).status).toBe(200);
      const before = await stored(id);
      const stale = await patch(id, { note: 'lost update' }, '"1"');
      expect(stale.status).toBe(412);
      expect(stale.headers['content-type']).toMatch(PROBLEM_JSON);
      expect(stale.headers.etag).toBe('"2"');
      expect(stale.body).toMatchObject({ type: 'urn:idempotent-orders:problem:stale-version', status: 412, currentVersion: 2 });
      expect(await stored(id)).toEqual(before);
      // A weak tag never matches (If-Match compares strongly), nor does a version that cannot exist.
      for (const ifMatch of ['W/"2"', '"99"', '"x"']) expect((await patch(id, { note: 'x' }, ifMatch)).status).toBe(412);
      // Any listed version may match.
      expect((await patch(id, { note: 'third' }, '"1", "2"')).body).toMatchObject({ note: 'third', version: 3 });
    });

    it('a transition bumps the version; once cancelled, the status is what a PATCH hears (409), whatever the If-Match', async () => {
      const id = await insertOrder('paid');
      expect((await move(id, 'cancel')).headers.etag).toBe('"2"');
      for (const ifMatch of ['"1"', '"2"']) {
        const res = await patch(id, { note: 'too late' }, ifMatch);
        expect(res.status).toBe(409);
        expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:order-not-editable', currentStatus: 'cancelled' });
      }
      expect(await stored(id)).toMatchObject({ status: 'cancelled', version: 2, note: 'first note' });
    });

    it('8 concurrent PATCHes with the same If-Match: exactly one 200, seven 412, one change in the database', async () => {
      const id = await insertOrder();
      const responses = await Promise.all(Array.from({ length: 8 }, (_, i) => patch(id, { note: `writer ${i}` }, '"1"')));
      const ok = responses.filter((r) => r.status === 200);
      const stale = responses.filter((r) => r.status === 412);
      expect(ok).toHaveLength(1);
      expect(stale).toHaveLength(7);
      for (const res of stale) expect(res.headers.etag).toBe('"2"');
      expect(ok[0].body.version).toBe(2);
      expect(await stored(id)).toMatchObject({ version: 2, note: ok[0].body.note, events: 0 });
    });

    it('without If-Match (or with *) is a 428; a malformed one is a 400; nothing changes', async () => {
      const id = await insertOrder();
      for (const ifMatch of [undefined, '*']) {
        const res = await patch(id, { note: 'x' }, ifMatch);
        expect(res.status).toBe(428);
        expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
        expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:precondition-required', status: 428 });
      }
      for (const ifMatch of ['1', '"1', 'W/1']) {
        const res = await patch(id, { note: 'x' }, ifMatch);
        expect(res.status).toBe(400);
        expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:invalid-if-match', status: 400 });
      }
      expect(await stored(id)).toMatchObject({ version: 1, note: 'first note' });
    });

    it('refuses a bad body with 400: unknown fields, nothing to change, a null or invalid address, a long note', async () => {
      const id = await insertOrder();
      for (const body of [
        { note: 'x', status: 'paid' },
        { version: 5 },
        {},
        { shippingAddress: null },
        { shippingAddress: { ...ADDRESS, country: 'gb' } },
        { note: 'x'.repeat(1001) },
        { note: 5 },
      ]) {
        const res = await patch(id, body, '"1"');
        expect([JSON.stringify(body), res.status]).toEqual([JSON.stringify(body), 400]);
        expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:validation-failed', status: 400 });
      }
      expect(await stored(id)).toMatchObject({ version: 1, note: 'first note', shipping_address: null });
    });

    it('is a 409 with currentStatus once the order has shipped', async () => {
      const id = await insertOrder('shipped');
      const res = await patch(id, { note: 'x' }, '"1"');
      expect(res.status).toBe(409);
      expect(res.headers['content-type']).toMatch(PROBLEM_JSON);
      expect(res.body).toMatchObject({
        type: 'urn:idempotent-orders:problem:order-not-editable',
        currentStatus: 'shipped',
        editableStatuses: ['created', 'paid'],
      });
      expect(await stored(id)).toMatchObject({ version: 1, note: 'first note' });
    });

    it("another client's order is a 404, whatever the If-Match", async () => {
      const id = await insertOrder();
      for (const target of [id, 'not-a-uuid']) {
        const res = await patch(target, { note: 'x' }, '"1"', BOB);
        expect(res.status).toBe(404);
        expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:order-not-found' });
      }
      expect(await stored(id)).toMatchObject({ version: 1, note: 'first note' });
    });
  });
});
