import { randomUUID } from 'node:crypto';
import { connect } from 'node:net';
import { Client } from 'pg';
import request from 'supertest';
import { ALICE, BOB, bearer, startTestApp, type TestApp } from './support/test-app';

/**
 * The HTTP contract (docs/contract.md#http-api): every error is application/problem+json with no internals,
 * hostile or malformed input is a 4xx and writes nothing, auth is a Bearer API key, and the
 * operational endpoints (health, metrics, docs) answer without one.
 */

const PROBLEM_JSON = /^application\/problem\+json/;
const BODY_LIMIT_BYTES = 64 * 1024;

const order = (overrides: Record<string, unknown> = {}) => ({
  currency: 'EUR',
  items: [{ sku: 'SKU-1', quantity: 2, unitPriceMinor: 1999 }],
  ...overrides,
});

/** Asserts an RFC 9457 problem with the given status, and that it carries nothing internal. */
function expectProblem(res: request.Response, status: number): void {
  expect({ status: res.status, contentType: res.headers['content-type'] }).toEqual({
    status,
    contentType: expect.stringMatching(PROBLEM_JSON),
  });
  expect(res.body).toMatchObject({ type: expect.any(String), title: expect.any(String), status, detail: expect.any(String) });
  expect(res.body.type.length).toBeGreaterThan(0);
  expect(res.body.title.length).toBeGreaterThan(0);
  expect(res.body.detail.length).toBeGreaterThan(0);
  expect(res.body).not.toHaveProperty('stack');
  expect(res.text).not.toMatch(/\n\s+at |node_modules|\.ts:\d+|\.js:\d+/);
}

/** The fields an `errors` array of a validation problem names. */
const fieldsOf = (res: request.Response): string[] => (res.body.errors as { field: string }[]).map((e) => e.field);

describe('HTTP contract', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(async () => {
    await t?.close();
  });

  /** A create with a fresh Idempotency-Key; a string body is sent as-is with the given content type. */
  const post = (body: unknown, { client = ALICE, contentType = 'application/json' } = {}) =>
    request(t.url)
      .post('/orders')
      .set('Authorization', bearer(client))
      .set('Idempotency-Key', randomUUID())
      .set('Content-Type', contentType)
      .send(body as string | object);

  const counts = async () => {
    const { rows } = await t.db.query(
      `SELECT (SELECT count(*)::int FROM orders) AS orders,
              (SELECT count(*)::int FROM order_items) AS items,
              (SELECT count(*)::int FROM idempotency_keys) AS keys`,
    );
    return rows[0] as { orders: number; items: number; keys: number };
  };

  /** Runs requests that must all be refused, and checks that none of them wrote anything. */
  async function refused<T>(send: () => Promise<T>): Promise<T> {
    const before = await counts();
    const result = await send();
    expect(await counts()).toEqual(before);
    return result;
  }

  describe('errors are problems', () => {
    it('an unknown route is a 404 problem, with or without a key', async () => {
      const anonymous = await request(t.url).get('/no-such-route');
      expectProblem(anonymous, 404);
      const authed = await request(t.url).post('/orders/x/y/z').set('Authorization', bearer(ALICE)).send({});
      expectProblem(authed, 404);
    });

    it('malformed JSON is a 400 problem', async () => {
      const res = await refused(() => post('{"currency": "EUR", "items": [', {}));
      expectProblem(res, 400);
    });

    it('a body with a __proto__ or constructor.prototype key is a 400 problem, and the prototype is untouched', async () => {
      for (const body of [
        '{"__proto__": {"polluted": true}, "currency": "EUR", "items": []}',
        '{"constructor": {"prototype": {"polluted": true}}}',
      ]) {
        const res = await refused(() => post(body));
        expectProblem(res, 400);
        expect(res.body.detail).toMatch(/forbidden prototype property/);
      }
      expect(({} as { polluted?: boolean }).polluted).toBeUndefined();
    });

    it('a body over the 64 KiB limit is a 413 problem', async () => {
      const body = JSON.stringify(order({ note: 'x'.repeat(BODY_LIMIT_BYTES) }));
      expect(Buffer.byteLength(body)).toBeGreaterThan(BODY_LIMIT_BYTES);
      const res = await refused(() => post(body));
      expectProblem(res, 413);
    });

    it('a body just under the limit is read (and judged on its content)', async () => {
      // A note over 1000 characters: parsed, then refused by validation rather than by size.
      const body = JSON.stringify(order({ note: 'x'.repeat(BODY_LIMIT_BYTES - 200) }));
      expect(Buffer.byteLength(body)).toBeLessThan(BODY_LIMIT_BYTES);
      const res = await refused(() => post(body));
      expectProblem(res, 400);
      expect(fieldsOf(res)).toEqual(['note']);
    });

    it('a body that is not JSON is a 415 problem, whatever it contains', async () => {
      const json = JSON.stringify(order());
      for (const contentType of ['text/plain', 'application/x-www-form-urlencoded', 'application/xml']) {
        const res = await refused(() => post(contentType === 'application/x-www-form-urlencoded' ? 'currency=EUR' : json, { contentType }));
        expectProblem(res, 415);
      }
    });

    it('no body under a form media type (what curl -d "" sends) is read as no body, not refused as a form', async () => {
      const created = await post(order());
      expect(created.status).toBe(201);
      const cancel = await request(t.url)
        .post(`/orders/${created.body.id}/cancel`)
        .set('Authorization', bearer(ALICE))
        .set('Idempotency-Key', randomUUID())
        .set('Content-Type', 'application/x-www-form-urlencoded')
        .set('Content-Length', '0');
      expect(cancel.status).toBe(200);
      expect(cancel.body.status).toBe('cancelled');
      // A create with no body is judged on its (absent) content, as an empty JSON body is.
      const create = await refused(() => post('', { contentType: 'application/x-www-form-urlencoded' }));
      expectProblem(create, 400);
      expect(create.body.type).toBe('urn:idempotent-orders:problem:validation-failed');
    });

    it('JSON in a charset other than UTF-8 is a 415 problem, not text stored garbled', async () => {
      const latin1 = Buffer.from(JSON.stringify(order({ note: 'Caf\u00e9' })), 'latin1');
      const res = await refused(() => post(latin1, { contentType: 'application/json; charset=latin1' }));
      expectProblem(res, 415);
      expect(res.body.detail).toBe('unsupported charset "LATIN1"');
      for (const contentType of ['application/json; charset=utf-8', 'application/json; charset="UTF-8"', 'application/json;charset=utf8']) {
        const ok = await post(JSON.stringify(order({ note: 'Caf\u00e9' })), { contentType });
        expect({ contentType, status: ok.status, note: ok.body.note }).toEqual({ contentType, status: 201, note: 'Caf\u00e9' });
      }
    });

    it('a URL the router cannot read, or a path parameter over its limit, is a problem with a request id', async () => {
      const badUrl = await request(t.url).get('/orders/%E0%A4%A').set('Authorization', bearer(ALICE));
      expectProblem(badUrl, 400);
      const longId = await request(t.url)
        .get(`/orders/${'a'.repeat(200)}`)
        .set('Authorization', bearer(ALICE));
      expectProblem(longId, 414);
      for (const res of [badUrl, longId]) expect(res.headers['x-request-id']).toEqual(expect.any(String));
    });

    it('what is not HTTP at all (two Content-Lengths, 20 KB of headers) is a problem too, and the connection closes', async () => {
      const { hostname, port } = new URL(t.url);
      /** Sends raw bytes and reads everything the server writes until it closes the connection. */
      const raw = (text: string) =>
        new Promise<string>((resolve, reject) => {
          const socket = connect(Number(port), hostname, () => socket.end(text));
          let received = '';
          socket.on('data', (chunk: Buffer) => (received += chunk.toString()));
          socket.on('close', () => resolve(received));
          socket.on('error', reject);
        });
      const answers = await refused(async () => [
        await raw('POST /orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}'),
        await raw(`GET /orders HTTP/1.1\r\nHost: x\r\nX-Filler: ${'a'.repeat(20_000)}\r\n\r\n`),
      ]);
      const parsed = answers.map((answer) => {
        const [head, body] = answer.split('\r\n\r\n');
        return {
          statusLine: head.split('\r\n')[0],
          contentType: /content-type: (.*)/i.exec(head)?.[1],
          body: JSON.parse(body) as { status: number },
        };
      });
      expect(parsed.map((p) => p.statusLine)).toEqual(['HTTP/1.1 400 Bad Request', 'HTTP/1.1 431 Request Header Fields Too Large']);
      for (const p of parsed) expect(p.contentType).toMatch(PROBLEM_JSON);
      expect(parsed.map((p) => p.body)).toEqual([
        { type: 'about:blank', title: 'Bad Request', status: 400, detail: 'The request is not valid HTTP.' },
        {
          type: 'about:blank',
          title: 'Request Header Fields Too Large',
          status: 431,
          detail: 'The request headers are larger than 16 KiB.',
        },
      ]);
    });

    it('a validation failure is a 400 problem with an errors array naming each failing field, nested ones too', async () => {
      const res = await refused(() =>
        post({
          currency: 'EURO',
          items: [
            { sku: 'SKU-1', quantity: 1, unitPriceMinor: 100 },
            { sku: 'SKU-2', quantity: 0, unitPriceMinor: -1 },
          ],
          shippingAddress: { name: 'Ada', line1: '1 Main St', city: 'Paris', postalCode: '75001', country: 'france' },
        }),
      );
      expectProblem(res, 400);
      expect(res.body.type).toBe('urn:idempotent-orders:problem:validation-failed');
      expect(res.body.errors).toEqual(expect.arrayContaining([{ field: expect.any(String), messages: expect.any(Array) }]));
      expect(fieldsOf(res).sort()).toEqual(['currency', 'items.1.quantity', 'items.1.unitPriceMinor', 'shippingAddress.country']);
      expect(res.body.detail).toContain('items.1.quantity');
    });

    it('an unknown field is a 400 that names it', async () => {
      const res = await refused(() => post(order({ discountMinor: 500 })));
      expectProblem(res, 400);
      expect(fieldsOf(res)).toEqual(['discountMinor']);
      const nested = await refused(() => post(order({ items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 1, colour: 'red' }] })));
      expectProblem(nested, 400);
      expect(fieldsOf(nested)).toEqual(['items.0.colour']);
    });

    it('an array where an order line is expected is a 400 naming the field, before anything reaches PostgreSQL', async () => {
      for (const items of [[[{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 100 }]], [[]], ['SKU-1']]) {
        const res = await refused(() => post(order({ items })));
        expectProblem(res, 400);
        expect(res.body.type).toBe('urn:idempotent-orders:problem:validation-failed');
        expect(fieldsOf(res)).toContain('items');
      }
    });

    it('a string where an integer is expected is a 400, not coerced', async () => {
      const res = await refused(() => post(order({ items: [{ sku: 'SKU-1', quantity: '2', unitPriceMinor: 1999 }] })));
      expectProblem(res, 400);
      expect(fieldsOf(res)).toEqual(['items.0.quantity']);
      const fraction = await refused(() => post(order({ items: [{ sku: 'SKU-1', quantity: 1.5, unitPriceMinor: 1e300 }] })));
      expectProblem(fraction, 400);
      expect(fieldsOf(fraction).sort()).toEqual(['items.0.quantity', 'items.0.unitPriceMinor']);
    });

    it.each([
      ['[]', '[]'],
      ['[{}]', '[{}]'],
      ['an array of a valid order', JSON.stringify([order()])],
      ['null', 'null'],
      ['a number', '0'],
      ['a string', '"order"'],
      ['true', 'true'],
      ['{}', '{}'],
      ['items: null', JSON.stringify(order({ items: null }))],
      ['items: [null]', JSON.stringify(order({ items: [null] }))],
      ['items: {}', JSON.stringify(order({ items: {} }))],
      ['shippingAddress: a string', JSON.stringify(order({ shippingAddress: 'nowhere' }))],
      ['currency: null', JSON.stringify(order({ currency: null }))],
    ])('body %s is a 400, never a 500', async (_what, body) => {
      const res = await refused(() => post(body));
      expectProblem(res, 400);
    });

    it('an empty body on a JSON create is a 400', async () => {
      const res = await refused(() =>
        request(t.url).post('/orders').set('Authorization', bearer(ALICE)).set('Idempotency-Key', randomUUID()),
      );
      expectProblem(res, 400);
    });

    it('a 500 is a problem with no stack trace and no database message', async () => {
      await t.db.query(
        `CREATE FUNCTION http_spec_boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'secret internal failure at table orders'; END $$`,
      );
      await t.db.query(
        `CREATE TRIGGER http_spec_boom BEFORE INSERT ON orders FOR EACH ROW WHEN (NEW.note = 'http-spec-boom') EXECUTE FUNCTION http_spec_boom()`,
      );
      try {
        const res = await refused(() => post(order({ note: 'http-spec-boom' })));
        expectProblem(res, 500);
        expect(res.body).toEqual({ type: 'about:blank', title: 'Internal Server Error', status: 500, detail: expect.any(String) });
        expect(res.text).not.toMatch(/secret internal failure|QueryFailedError|http_spec_boom|plpgsql|Error:/);
      } finally {
        await t.db.query('DROP TRIGGER http_spec_boom ON orders; DROP FUNCTION http_spec_boom()');
      }
    });
  });

  describe('hostile input', () => {
    it('__proto__ and constructor keys pollute nothing: 400, or an order without them', async () => {
      const bodies = [
        `{"currency":"EUR","items":[{"sku":"P-1","quantity":1,"unitPriceMinor":1}],"__proto__":{"polluted":"yes","isAdmin":true}}`,
        `{"currency":"EUR","items":[{"sku":"P-2","quantity":1,"unitPriceMinor":1,"__proto__":{"polluted":"yes"}}]}`,
        `{"currency":"EUR","items":[{"sku":"P-3","quantity":1,"unitPriceMinor":1}],"constructor":{"prototype":{"polluted":"yes"}}}`,
        `{"currency":"EUR","items":[{"sku":"P-4","quantity":1,"unitPriceMinor":1}],"shippingAddress":{"name":"a","line1":"b","city":"c","postalCode":"d","country":"FR","__proto__":{"polluted":"yes"}}}`,
      ];
      for (const body of bodies) {
        const before = await counts();
        const res = await post(body);
        expect([400, 201]).toContain(res.status);
        if (res.status === 400) {
          expectProblem(res, 400);
          expect(await counts()).toEqual(before);
        } else {
          expect(res.text).not.toMatch(/polluted|isAdmin|__proto__|prototype/);
          const { rows } = await t.db.query('SELECT note, shipping_address FROM orders WHERE id = $1', [res.body.id]);
          expect(JSON.stringify(rows)).not.toMatch(/polluted|isAdmin/);
        }
        // The app runs in this process: a polluted prototype would show here.
        expect(({} as Record<string, unknown>).polluted).toBeUndefined();
        expect(({} as Record<string, unknown>).isAdmin).toBeUndefined();
        expect(Object.prototype).not.toHaveProperty('polluted');
      }
      // And the service still works normally afterwards.
      const ok = await post(order());
      expect(ok.status).toBe(201);
      expect(ok.body).not.toHaveProperty('polluted');
    });

    it.each([
      [
        'a 10 000-deep array in a field',
        `{"currency":"EUR","items":[{"sku":"D","quantity":1,"unitPriceMinor":1}],"note":${'['.repeat(10_000)}${']'.repeat(10_000)}}`,
      ],
      ['10 000-deep objects', `${'{"a":'.repeat(10_000)}1${'}'.repeat(10_000)}`],
      ['a 10 000-deep array as the body', `${'['.repeat(10_000)}${']'.repeat(10_000)}`],
      ['10 000-deep items', `{"currency":"EUR","items":${'['.repeat(10_000)}${']'.repeat(10_000)}}`],
    ])('%s is a 4xx, not a 500', async (_what, body) => {
      expect(Buffer.byteLength(body)).toBeLessThan(BODY_LIMIT_BYTES);
      const res = await refused(() => post(body));
      expect(res.status).toBeGreaterThanOrEqual(400);
      expect(res.status).toBeLessThan(500);
      expectProblem(res, res.status);
    });

    it('a 10 000-deep body on a route without the Idempotency-Key layer is a 4xx, not a 500', async () => {
      const created = await post(order());
      expect(created.status).toBe(201);
      const body = `{"note":${'['.repeat(10_000)}${']'.repeat(10_000)}}`;
      const res = await refused(() =>
        request(t.url)
          .patch(`/orders/${created.body.id}`)
          .set('Authorization', bearer(ALICE))
          .set('If-Match', '"1"')
          .set('Content-Type', 'application/json')
          .send(body),
      );
      expect(res.status).toBeGreaterThanOrEqual(400);
      expect(res.status).toBeLessThan(500);
      expectProblem(res, res.status);
      const { rows } = await t.db.query('SELECT version, note FROM orders WHERE id = $1', [created.body.id]);
      expect(rows).toEqual([{ version: expect.anything(), note: null }]);
      expect(Number(rows[0].version)).toBe(1);
    });

    it.each([
      ['a NUL in the note', '{"currency":"EUR","items":[{"sku":"N","quantity":1,"unitPriceMinor":1}],"note":"a\\u0000b"}'],
      [
        'a NUL in the address (jsonb)',
        '{"currency":"EUR","items":[{"sku":"N","quantity":1,"unitPriceMinor":1}],"shippingAddress":{"name":"a\\u0000","line1":"b","city":"c","postalCode":"d","country":"FR"}}',
      ],
      ['a lone surrogate in the note', '{"currency":"EUR","items":[{"sku":"N","quantity":1,"unitPriceMinor":1}],"note":"x\\ud800"}'],
      ['a lone surrogate in a key', '{"currency":"EUR","items":[{"sku":"N","quantity":1,"unitPriceMinor":1}],"\\udc00":1}'],
    ])('text PostgreSQL cannot store as sent (%s) is a 400, not a 500', async (_what, body) => {
      const res = await refused(() => post(body));
      expectProblem(res, 400);
      expect(res.body.type).toBe('urn:idempotent-orders:problem:invalid-json-body');
    });

    it('a NUL sent to PATCH is a 400 and changes nothing', async () => {
      const created = await post(order());
      const res = await request(t.url)
        .patch(`/orders/${created.body.id}`)
        .set('Authorization', bearer(ALICE))
        .set('If-Match', '"1"')
        .set('Content-Type', 'application/json')
        .send('{"note":"a\\u0000"}');
      expectProblem(res, 400);
      const { rows } = await t.db.query('SELECT version FROM orders WHERE id = $1', [created.body.id]);
      expect(rows[0].version).toBe(1);
    });

    it('a cursor of the right shape naming a date that cannot exist is a 400', async () => {
      const cursor = Buffer.from(JSON.stringify(['2024-13-45 99:99:99+00', '00000000-0000-4000-8000-000000000000'])).toString('base64url');
      const res = await request(t.url).get(`/orders?cursor=${cursor}`).set('Authorization', bearer(ALICE));
      expectProblem(res, 400);
      expect(res.body.type).toBe('urn:idempotent-orders:problem:invalid-cursor');
    });

    it.each([
      ['a huge limit', '?limit=99999999999999999999999999999'],
      ['limit=1e308', '?limit=1e308'],
      ['limit=Infinity', '?limit=Infinity'],
      ['limit one over the maximum', '?limit=101'],
      ['limit=0', '?limit=0'],
      ['a negative limit', '?limit=-1'],
      ['a limit that is not a number', '?limit=abc'],
      ['a repeated limit', '?limit=1&limit=2'],
      ['an operator-shaped status', '?status[$ne]=created'],
      ['an unknown status', '?status=everything'],
      ['a 5 000-character cursor', `?cursor=${'A'.repeat(5_000)}`],
      ['a cursor that decodes to garbage', '?cursor=%FF%FE'],
    ])('GET /orders with %s is a 400 problem', async (_what, query) => {
      const res = await request(t.url).get(`/orders${query}`).set('Authorization', bearer(ALICE));
      expectProblem(res, 400);
    });
  });

  describe('authentication', () => {
    it('no Authorization header: 401 with WWW-Authenticate: Bearer', async () => {
      const res = await request(t.url).get('/orders');
      expectProblem(res, 401);
      expect(res.headers['www-authenticate']).toBe('Bearer');
    });

    it.each([
      ['a wrong key', 'Bearer not-the-key-0123456789'],
      ['a key with one character changed', `Bearer ${ALICE.secret.slice(0, -1)}X`],
      ['the dev key, which a run with API_KEYS must refuse', 'Bearer dev-secret-change-me'],
      ['the Basic scheme', `Basic ${Buffer.from(`${ALICE.clientId}:${ALICE.secret}`).toString('base64')}`],
      ['the bare key without a scheme', ALICE.secret],
      ['an empty Bearer', 'Bearer '],
      ['two tokens', `Bearer ${ALICE.secret} ${BOB.secret}`],
    ])('%s: 401 with WWW-Authenticate: Bearer', async (_what, authorization) => {
      const res = await request(t.url).get('/orders').set('Authorization', authorization);
      expectProblem(res, 401);
      expect(res.headers['www-authenticate']).toBe('Bearer');
      expect(res.text).not.toContain(ALICE.secret);
    });

    it('a valid key: 200', async () => {
      for (const client of [ALICE, BOB]) {
        const res = await request(t.url).get('/orders').set('Authorization', bearer(client));
        expect(res.status).toBe(200);
        expect(res.headers['content-type']).toMatch(/^application\/json/);
        expect(res.body).toEqual({ items: expect.any(Array), nextCursor: null });
      }
    });

    it('an unauthenticated or wrongly authenticated create writes nothing', async () => {
      const none = await refused(() => request(t.url).post('/orders').set('Idempotency-Key', randomUUID()).send(order()));
      expectProblem(none, 401);
      const wrong = await refused(() =>
        request(t.url)
          .post('/orders')
          .set('Authorization', 'Bearer wrong-key-0123456789')
          .set('Idempotency-Key', randomUUID())
          .send(order()),
      );
      expectProblem(wrong, 401);
    });
  });

  describe('request ids', () => {
    it('every response carries X-Request-Id, whatever its status', async () => {
      const responses: [string, request.Response][] = [
        ['200 list', await request(t.url).get('/orders').set('Authorization', bearer(ALICE))],
        ['201 create', await post(order())],
        ['400 malformed JSON', await post('{')],
        ['400 validation', await post({})],
        ['401', await request(t.url).get('/orders')],
        ['404', await request(t.url).get('/no-such-route')],
        ['413', await post(JSON.stringify(order({ note: 'x'.repeat(BODY_LIMIT_BYTES) })))],
        ['415', await post('x', { contentType: 'text/plain' })],
        ['health', await request(t.url).get('/health')],
        ['metrics', await request(t.url).get('/metrics')],
      ];
      const missing = responses.filter(([, res]) => !res.headers['x-request-id']).map(([what]) => what);
      expect(missing).toEqual([]);
      const ids = responses.map(([, res]) => res.headers['x-request-id']);
      expect(new Set(ids).size).toBe(ids.length);
    });

    it('a sane incoming X-Request-Id is echoed back; an unsafe one is replaced', async () => {
      const sane = 'req-7f3a.b2:c_9';
      const echoed = await request(t.url).get('/orders').set('Authorization', bearer(ALICE)).set('X-Request-Id', sane);
      expect(echoed.status).toBe(200);
      expect(echoed.headers['x-request-id']).toBe(sane);

      const onError = await request(t.url).get('/orders').set('X-Request-Id', sane);
      expect(onError.status).toBe(401);
      expect(onError.headers['x-request-id']).toBe(sane);

      for (const unsafe of ['has space', 'x'.repeat(129), '<script>']) {
        const res = await request(t.url).get('/orders').set('Authorization', bearer(ALICE)).set('X-Request-Id', unsafe);
        expect(res.headers['x-request-id']).toEqual(expect.any(String));
        expect(res.headers['x-request-id']).not.toBe(unsafe);
        expect(res.headers['x-request-id']).toMatch(/^[A-Za-z0-9._:-]{1,128}$/);
      }
    });
  });

  describe('operational endpoints', () => {
    it('GET /health: 200 {status: ok} without a key', async () => {
      const res = await request(t.url).get('/health');
      expect(res.status).toBe(200);
      expect(res.body).toMatchObject({ status: 'ok', info: { database: { status: 'up' } } });
    });

    it('GET /metrics: Prometheus text with the request histogram by route pattern and the idempotency counter', async () => {
      const created = await post(order());
      expect(created.status).toBe(201);
      // Read the created order by id: the series must name the pattern, never the id.
      expect((await request(t.url).get(`/orders/${created.body.id}`).set('Authorization', bearer(ALICE))).status).toBe(200);

      // The histogram is observed on the response's 'finish': poll briefly rather than race it.
      const deadline = Date.now() + 5_000;
      let text: string;
      for (;;) {
        const res = await request(t.url).get('/metrics');
        expect(res.status).toBe(200);
        expect(res.headers['content-type']).toMatch(/^text\/plain/);
        text = res.text;
        if (/http_request_duration_seconds_bucket\{[^}]*route="\/orders\/:id"/.test(text) || Date.now() > deadline) break;
      }
      expect(text).toMatch(/^http_request_duration_seconds_bucket\{[^}]*method="POST"[^}]*route="\/orders"[^}]*status="201"[^}]*\} [1-9]/m);
      expect(text).toMatch(/^http_request_duration_seconds_bucket\{[^}]*route="\/orders\/:id"/m);
      expect(text).not.toContain(created.body.id);
      expect(text).toMatch(/^idempotency_requests_total\{outcome="executed"\} [1-9]/m);
      expect(text).toMatch(/^# TYPE idempotency_requests_total counter$/m);
    });

    it('GET /docs: Swagger UI, without a key', async () => {
      let res = await request(t.url).get('/docs');
      if (res.status === 301 || res.status === 302) res = await request(t.url).get(res.headers.location);
      expect(res.status).toBe(200);
      expect(res.headers['content-type']).toMatch(/^text\/html/);
      expect(res.text).toMatch(/swagger-ui/i);
    });

    it('GET /docs-json: the OpenAPI document with bearer auth, the order paths, Idempotency-Key and problem responses', async () => {
      const res = await request(t.url).get('/docs-json');
      expect(res.status).toBe(200);
      expect(res.headers['content-type']).toMatch(/^application\/json/);
      const doc = res.body;
      expect(doc.openapi).toMatch(/^3\./);
      expect(Object.values(doc.components.securitySchemes)).toContainEqual(expect.objectContaining({ type: 'http', scheme: 'bearer' }));
      expect(Object.keys(doc.paths)).toEqual(expect.arrayContaining(['/orders', '/orders/{id}']));

      const create = doc.paths['/orders'].post;
      // Optional each, as exactly one of the two is required (see submit-tokens.e2e-spec.ts).
      expect(create.parameters).toContainEqual(expect.objectContaining({ name: 'Idempotency-Key', in: 'header', required: false }));
      expect(create.parameters).toContainEqual(expect.objectContaining({ name: 'Submit-Token', in: 'header', required: false }));
      expect(create.security).toEqual(
        expect.arrayContaining([expect.objectContaining({ [Object.keys(doc.components.securitySchemes)[0]]: [] })]),
      );
      for (const status of ['400', '401', '409', '422']) {
        expect({ status, content: Object.keys(create.responses[status]?.content ?? {}) }).toEqual({
          status,
          content: ['application/problem+json'],
        });
      }
      expect(doc.paths['/orders/{id}'].get.parameters).toContainEqual(expect.objectContaining({ name: 'id', in: 'path' }));
    });
  });
});

describe('a busy connection pool', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp({ DATABASE_POOL_SIZE: '2', DATABASE_POOL_WAIT_MS: '300' });
  });
  afterAll(async () => {
    await t?.close();
  });

  it('answers 503 with Retry-After when no connection frees up in DATABASE_POOL_WAIT_MS, and recovers', async () => {
    // Another transaction holds order number BLOCK, so two creates of it wait inside theirs, holding both connections.
    const holder = new Client({ connectionString: t.databaseUrl });
    await holder.connect();
    try {
      await holder.query('BEGIN');
      await holder.query(`INSERT INTO orders (client_id, order_number, currency, total_minor) VALUES ('alice', 'BLOCK', 'EUR', 1)`);
      const blocked = Promise.all(
        [1, 2].map(() =>
          request(t.url)
            .post('/orders')
            .set('Authorization', bearer(ALICE))
            .set('Idempotency-Key', randomUUID())
            .send(order({ orderNumber: 'BLOCK' }))
            .then((r) => r),
        ),
      );
      const deadline = Date.now() + 5_000;
      while (
        (
          await t.db.query(
            `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`,
          )
        ).rows[0].n < 2
      ) {
        if (Date.now() > deadline) throw new Error('the two creates never blocked');
      }
      const busy = await request(t.url).get('/orders').set('Authorization', bearer(ALICE));
      expectProblem(busy, 503);
      expect(busy.headers['retry-after']).toBe('1');
      await holder.query('ROLLBACK');
      const statuses = (await blocked).map((r) => r.status).sort();
      expect(statuses).toEqual([200, 201]);
    } finally {
      await holder.end();
    }
    expect((await request(t.url).get('/orders').set('Authorization', bearer(ALICE))).status).toBe(200);
  });
});
