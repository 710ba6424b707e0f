import { randomBytes, randomUUID } from 'node:crypto';
import request from 'supertest';
import { SubmitTokenReaper } from '../src/submit-tokens/submit-token-reaper';
import { ALICE, BOB, bearer, startTestApp, type TestApp } from './support/test-app';

const order = (overrides: Record<string, unknown> = {}) => ({
  currency: 'EUR',
  items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 1000 }],
  ...overrides,
});

const TTL_SECONDS = 120;

describe('Submit-Token on POST /orders (docs/contract.md#orders)', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp({ SUBMIT_TOKEN_TTL_SECONDS: String(TTL_SECONDS) });
  });
  afterAll(async () => {
    await t?.close();
  });

  const issue = async (client = ALICE): Promise<string> => {
    const res = await request(t.url).post('/submit-tokens').set('Authorization', bearer(client));
    expect(res.status).toBe(201);
    return res.body.token as string;
  };
  const submit = (token: string | undefined, body: unknown, client = ALICE, idempotencyKey?: string) => {
    const req = request(t.url).post('/orders').set('Authorization', bearer(client));
    if (token !== undefined) void req.set('Submit-Token', token);
    if (idempotencyKey !== undefined) void req.set('Idempotency-Key', idempotencyKey);
    return req.send(body as object);
  };
  const tokenRow = async (token: string) =>
    (await t.db.query('SELECT client_id, consumed_at, order_id FROM submit_tokens WHERE token = $1', [token])).rows[0] as
      { client_id: string; consumed_at: Date | null; order_id: string | null } | undefined;
  const ordersWithNote = async (note: string) =>
    (await t.db.query('SELECT count(*)::int AS n FROM orders WHERE note = $1', [note])).rows[0].n as number;

  /** The token was left exactly as issued: unconsumed, no order, and alice can still create with it. */
  const expectUnconsumedAndUsable = async (token: string, note: string) => {
    expect(await tokenRow(token)).toEqual({ client_id: 'alice', consumed_at: null, order_id: null });
    const res = await submit(token, order({ note }));
    expect(res.status).toBe(201);
    expect(await tokenRow(token)).toEqual({ client_id: 'alice', consumed_at: expect.any(Date), order_id: res.body.id });
  };

  it('POST /submit-tokens issues a 32-byte base64url token living SUBMIT_TOKEN_TTL_SECONDS; it creates an order (201)', async () => {
    const res = await request(t.url).post('/submit-tokens').set('Authorization', bearer(ALICE));
    expect(res.status).toBe(201);
    expect(res.headers['content-type']).toMatch(/^application\/json/);
    expect(Object.keys(res.body).sort()).toEqual(['expiresAt', 'token']);
    expect(res.body.token).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(Buffer.from(res.body.token, 'base64url')).toHaveLength(32);
    const { rows } = await t.db.query(
      `SELECT client_id, consumed_at, order_id, extract(epoch FROM expires_at - created_at)::int AS ttl, expires_at FROM submit_tokens WHERE token = $1`,
      [res.body.token],
    );
    expect(rows).toEqual([
      { client_id: 'alice', consumed_at: null, order_id: null, ttl: TTL_SECONDS, expires_at: new Date(res.body.expiresAt) },
    ]);

    const created = await submit(res.body.token, order({ note: 'with-token' }));
    expect(created.status).toBe(201);
    expect(created.headers.location).toBe(`/orders/${created.body.id}`);
    expect(created.headers.etag).toBe('"1"');
    expect(created.body).toMatchObject({ status: 'created', currency: 'EUR', totalMinor: 1000, note: 'with-token' });
    expect(await tokenRow(res.body.token)).toEqual({ client_id: 'alice', consumed_at: expect.any(Date), order_id: created.body.id });
  });

  it('POST /submit-tokens needs an API key', async () => {
    const res = await request(t.url).post('/submit-tokens');
    expect(res.status).toBe(401);
    expect(res.body.type).toBe('urn:idempotent-orders:problem:unauthorized');
  });

  it('12 concurrent submits of one token: one 201, eleven 409 naming that order; one order in the database', async () => {
    const token = await issue();
    const responses = await Promise.all(Array.from({ length: 12 }, () => submit(token, order({ note: 'storm' }))));
    const created = responses.filter((r) => r.status === 201);
    const refused = responses.filter((r) => r.status === 409);
    expect(created).toHaveLength(1);
    expect(refused).toHaveLength(11);
    const orderId = created[0].body.id as string;
    for (const r of refused) {
      expect(r.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(r.body).toMatchObject({ type: 'urn:idempotent-orders:problem:submit-token-used', status: 409, orderId });
    }
    expect(await ordersWithNote('storm')).toBe(1);
    expect(await tokenRow(token)).toEqual({ client_id: 'alice', consumed_at: expect.any(Date), order_id: orderId });

    // And any time later: still 409 with the order, still one order.
    const again = await submit(token, order({ note: 'storm' }));
    expect(again.status).toBe(409);
    expect(again.body).toMatchObject({
      type: 'urn:idempotent-orders:problem:submit-token-used',
      title: 'Submit token already used',
      orderId,
    });
    expect(again.body.detail).toContain(orderId);
    expect(await ordersWithNote('storm')).toBe(1);
  });

  it('an unknown token is a 422 and consumes nothing', async () => {
    const token = await issue();
    const unknown = randomBytes(32).toString('base64url');
    for (const bad of [unknown, 'not-a-token', `${token.slice(0, -1)}${token.endsWith('A') ? 'B' : 'A'}`]) {
      const res = await submit(bad, order({ note: 'unknown-token' }));
      expect(res.status).toBe(422);
      expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:submit-token-invalid', status: 422 });
    }
    expect(await ordersWithNote('unknown-token')).toBe(0);
    await expectUnconsumedAndUsable(token, 'after-unknown');
  });

  it('an expired token is a 422 and is not consumed', async () => {
    const token = await issue();
    await t.db.query(`UPDATE submit_tokens SET expires_at = now() - interval '1 second' WHERE token = $1`, [token]);
    const res = await submit(token, order({ note: 'expired' }));
    expect(res.status).toBe(422);
    expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:submit-token-invalid', status: 422 });
    expect(await ordersWithNote('expired')).toBe(0);
    // Given back its lifetime, the token shows the refused attempt left it untouched.
    await t.db.query(`UPDATE submit_tokens SET expires_at = now() + interval '1 minute' WHERE token = $1`, [token]);
    await expectUnconsumedAndUsable(token, 'after-expired');
  });

  it("bob using alice's token is a 422, indistinguishable from an unknown one, and consumes nothing", async () => {
    const token = await issue(ALICE);
    const res = await submit(token, order({ note: 'bob-with-alice-token' }), BOB);
    expect(res.status).toBe(422);
    const unknown = await submit(randomBytes(32).toString('base64url'), order({ note: 'bob-with-alice-token' }), BOB);
    expect(res.body).toEqual(unknown.body);
    expect(await ordersWithNote('bob-with-alice-token')).toBe(0);
    await expectUnconsumedAndUsable(token, 'after-bob');
  });

  it('a used token is a 409 for its owner but a 422 for another client: no hint that it exists', async () => {
    const token = await issue(ALICE);
    expect((await submit(token, order())).status).toBe(201);
    const res = await submit(token, order(), BOB);
    expect(res.status).toBe(422);
    expect(res.body.orderId).toBeUndefined();
  });

  it('an invalid body with a valid token is a 400 and the token is not consumed', async () => {
    const token = await issue();
    const res = await submit(token, order({ items: [{ sku: 'SKU-1', quantity: 0, unitPriceMinor: 1000 }], note: 'invalid-body' }));
    expect(res.status).toBe(400);
    expect(res.body.type).toBe('urn:idempotent-orders:problem:validation-failed');
    expect(await ordersWithNote('invalid-body')).toBe(0);
    await expectUnconsumedAndUsable(token, 'after-invalid-body');
  });

  it('an order the create refuses after the token was claimed (409 order number) rolls the claim back', async () => {
    const first = await submit(await issue(), order({ orderNumber: 'TOKEN-PO-1' }));
    expect(first.status).toBe(201);
    const token = await issue();
    // Passes validation, so the token's UPDATE runs; then the create fails in the same transaction.
    const res = await submit(token, order({ orderNumber: 'TOKEN-PO-1', currency: 'USD' }));
    expect(res.status).toBe(409);
    expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:order-number-conflict', orderId: first.body.id });
    await expectUnconsumedAndUsable(token, 'after-number-conflict');
  });

  it('the same orderNumber and content with a new token returns the existing order (200) and records it on the token', async () => {
    const first = await submit(await issue(), order({ orderNumber: 'TOKEN-PO-2' }));
    expect(first.status).toBe(201);
    const token = await issue();
    const res = await submit(token, order({ orderNumber: 'TOKEN-PO-2' }));
    expect(res.status).toBe(200);
    expect(res.body).toEqual(first.body);
    expect(await tokenRow(token)).toEqual({ client_id: 'alice', consumed_at: expect.any(Date), order_id: first.body.id });
  });

  it('Idempotency-Key and Submit-Token together are a 400, even for a key that would replay; nothing is consumed or stored', async () => {
    const token = await issue();
    const key = randomUUID();
    const both = await submit(token, order({ note: 'both-headers' }), ALICE, key);
    expect(both.status).toBe(400);
    expect(both.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(both.body).toMatchObject({ type: 'urn:idempotent-orders:problem:idempotency-key-and-submit-token', status: 400 });
    expect(await ordersWithNote('both-headers')).toBe(0);
    expect((await t.db.query('SELECT count(*)::int AS n FROM idempotency_keys WHERE key = $1', [key])).rows[0].n).toBe(0);

    // A completed key replays without running the handler: the check must come before the interceptor.
    const keyed = await submit(undefined, order({ note: 'keyed' }), ALICE, key);
    expect(keyed.status).toBe(201);
    const replay = await submit(token, order({ note: 'keyed' }), ALICE, key);
    expect(replay.status).toBe(400);
    expect(replay.headers['idempotent-replayed']).toBeUndefined();
    expect(await ordersWithNote('keyed')).toBe(1);
    await expectUnconsumedAndUsable(token, 'after-both-headers');
  });

  it('neither header is a 400 "Idempotency-Key is missing" naming both options; nothing is created', async () => {
    const res = await submit(undefined, order({ note: 'no-header' }));
    expect(res.status).toBe(400);
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(res.body).toMatchObject({
      type: 'urn:idempotent-orders:problem:idempotency-key-missing',
      title: 'Idempotency-Key is missing',
      status: 400,
    });
    expect(res.body.detail).toContain('Idempotency-Key');
    expect(res.body.detail).toContain('Submit-Token');
    expect(await ordersWithNote('no-header')).toBe(0);
  });

  it('the reaper deletes tokens expired more than a day ago, in batches, and keeps the rest', async () => {
    const { rows: placed } = await t.db.query<{ token: string }>(
      `INSERT INTO submit_tokens (token, client_id, created_at, expires_at)
       SELECT 'reap-' || g, 'alice', now() - interval '3 days', now() - interval '2 days' - g * interval '1 second'
         FROM generate_series(1, 501) g
       RETURNING token`,
    );
    expect(placed).toHaveLength(501);
    const consumed = await issue();
    expect((await submit(consumed, order({ note: 'reaped-order' }))).status).toBe(201);
    await t.db.query(`UPDATE submit_tokens SET expires_at = now() - interval '25 hours' WHERE token = $1`, [consumed]);
    const recentlyExpired = await issue();
    await t.db.query(`UPDATE submit_tokens SET expires_at = now() - interval '23 hours' WHERE token = $1`, [recentlyExpired]);
    const live = await issue();
    const before = (await t.db.query('SELECT count(*)::int AS n FROM submit_tokens')).rows[0].n as number;

    // 502 long-expired rows: more than one batch of 500.
    expect(await t.app.get(SubmitTokenReaper).reapExpiredSubmitTokens()).toBe(502);
    const { rows } = await t.db.query(`SELECT count(*)::int AS n FROM submit_tokens WHERE token LIKE 'reap-%' OR token = $1`, [consumed]);
    expect(rows[0].n).toBe(0);
    expect(await tokenRow(recentlyExpired)).toBeDefined();
    expect(await tokenRow(live)).toBeDefined();
    expect((await t.db.query('SELECT count(*)::int AS n FROM submit_tokens')).rows[0].n).toBe(before - 502);
    // The order outlives its token.
    expect(await ordersWithNote('reaped-order')).toBe(1);
    expect(await t.app.get(SubmitTokenReaper).reapExpiredSubmitTokens()).toBe(0);
  });

  it('Swagger documents POST /submit-tokens, the Submit-Token header and its problems beside the Idempotency-Key ones', async () => {
    const doc = (await request(t.url).get('/docs-json')).body;
    const issueOp = doc.paths['/submit-tokens'].post;
    expect(issueOp.responses['201'].content['application/json'].schema).toEqual({ $ref: '#/components/schemas/SubmitTokenView' });
    expect(Object.keys(doc.components.schemas.SubmitTokenView.properties).sort()).toEqual(['expiresAt', 'token']);
    expect(issueOp.security).toBeDefined();

    const create = doc.paths['/orders'].post;
    const header = create.parameters.find((p: { name: string }) => p.name === 'Submit-Token');
    expect(header).toMatchObject({ in: 'header', required: false });
    expect(header.description).toMatch(/Idempotency-Key/);
    const exampleTypes = (status: string) => {
      const content = create.responses[status].content['application/problem+json'];
      return Object.values(content.examples as Record<string, { value: { type: string } }>)
        .map((e) => e.value.type.split(':').pop())
        .sort();
    };
    // about:blank (malformed JSON) and invalid-json-body: the body parser's refusals, documented on every operation.
    expect(exampleTypes('400')).toEqual([
      'blank',
      'idempotency-key-and-submit-token',
      'idempotency-key-malformed',
      'idempotency-key-missing',
      'invalid-json-body',
      'validation-failed',
    ]);
    expect(exampleTypes('409')).toEqual(['idempotency-key-in-use', 'order-number-conflict', 'submit-token-used']);
    expect(exampleTypes('422')).toEqual(['idempotency-key-reused', 'submit-token-invalid']);
    // Merging examples kept the Retry-After header of the in-use 409.
    expect(create.responses['409'].headers['Retry-After']).toBeDefined();
  });
});
