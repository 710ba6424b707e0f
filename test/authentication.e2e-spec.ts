/**
 * The API key is checked before the body is read, and wrong keys are limited per source address: an anonymous caller
 * cannot make the service parse its JSON, and a guesser is stopped after FAILED_AUTHENTICATIONS_PER_MINUTE tries.
 * The app as `npm start` builds it (createHttpApp), on a real socket; distinct addresses come from X-Forwarded-For,
 * which TRUST_PROXY=loopback believes from this machine (as compose's nginx is believed).
 */
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { FAILED_AUTHENTICATION_BLOCK_SECONDS, FAILED_AUTHENTICATIONS_PER_MINUTE } from '../src/common/api-keys';
import { ALICE, bearer, startTestApp, type TestApp } from './support/test-app';

const BAD_JSON = '{"orderNumber": ';
const ORDER = { orderNumber: 'AUTH-1', currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 900 }] };

describe('authentication before the body, and failed authentications limited per address', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp({ TRUST_PROXY: 'loopback', PSP_WEBHOOK_URL: 'none' });
  });
  afterAll(async () => {
    await t?.close();
  });

  it('every operation that needs a key answers an anonymous bad JSON body 401, not 400: the body was never parsed', async () => {
    const document = (await request(t.url).get('/docs-json')).body as {
      paths: Record<string, Record<string, { security?: Record<string, unknown>[] }>>;
    };
    const guarded = Object.entries(document.paths).flatMap(([path, operations]) =>
      Object.entries(operations)
        // The API key's operations: the document's default (no `security` of their own) or naming it. The sandbox's /psp
        // operations name the provider's key, which the sandbox checks as a provider would.
        .filter(([, operation]) => operation.security === undefined || operation.security.some((scheme) => 'bearer' in scheme))
        .map(([method, operation]) => ({ method, path: path.replace(/\{[^}]+\}/g, randomUUID()), operation })),
    );
    expect(guarded.length).toBeGreaterThan(10);
    for (const { method, path } of guarded) {
      const agent = request(t.url);
      const res = await agent[method as 'post'](path)
        .set('X-Forwarded-For', '198.51.100.1')
        .set('Content-Type', 'application/json')
        .send(BAD_JSON);
      expect([`${method} ${path}`, res.status, res.headers['content-type']]).toEqual([
        `${method} ${path}`,
        401,
        'application/problem+json; charset=utf-8',
      ]);
      expect(res.headers['www-authenticate']).toBe('Bearer');
    }
    // The same body with a key is parsed, and refused for what it is.
    const parsed = await request(t.url)
      .post('/orders')
      .set('Authorization', bearer(ALICE))
      .set('Content-Type', 'application/json')
      .send(BAD_JSON);
    expect(parsed.status).toBe(400);
  });

  it(`${FAILED_AUTHENTICATIONS_PER_MINUTE} wrong keys from one address, then 429 for it (a good key too), while other addresses go on`, async () => {
    const guesser = '203.0.113.7';
    const wrong = (i: number) =>
      request(t.url).get('/orders').set('X-Forwarded-For', guesser).set('Authorization', `Bearer guess-${i}-0123456789abcdef`);
    const statuses = [];
    for (let i = 0; i < FAILED_AUTHENTICATIONS_PER_MINUTE; i++) statuses.push((await wrong(i)).status);
    expect(statuses).toEqual(Array(FAILED_AUTHENTICATIONS_PER_MINUTE).fill(401));
    // In parallel now: every one is refused, none gets through to a check that could say "right".
    const blocked = await Promise.all(Array.from({ length: 10 }, (_, i) => wrong(100 + i)));
    expect(blocked.map((r) => r.status)).toEqual(Array(10).fill(429));
    expect(blocked[0].headers['content-type']).toBe('application/problem+json; charset=utf-8');
    expect(blocked[0].body.type).toBe('urn:idempotent-orders:problem:too-many-failed-authentications');
    expect(Number(blocked[0].headers['retry-after'])).toBeGreaterThan(0);
    expect(Number(blocked[0].headers['retry-after'])).toBeLessThanOrEqual(FAILED_AUTHENTICATION_BLOCK_SECONDS);
    // A good key from the blocked address is refused too, and writes nothing.
    const create = await request(t.url)
      .post('/orders')
      .set('X-Forwarded-For', guesser)
      .set('Authorization', bearer(ALICE))
      .set('Idempotency-Key', randomUUID())
      .send(ORDER);
    expect(create.status).toBe(429);
    const { rows } = await t.db.query(`SELECT count(*)::int AS n FROM orders WHERE order_number = $1`, [ORDER.orderNumber]);
    expect(rows[0].n).toBe(0);
    // Another address is not affected.
    const other = await request(t.url).get('/orders').set('X-Forwarded-For', '203.0.113.8').set('Authorization', bearer(ALICE));
    expect(other.status).toBe(200);
  });

  it('a request with no key is not a guess: any number of them, and the address still authenticates', async () => {
    const address = '203.0.113.9';
    const anonymous = await Promise.all(
      Array.from({ length: FAILED_AUTHENTICATIONS_PER_MINUTE * 2 }, () => request(t.url).get('/orders').set('X-Forwarded-For', address)),
    );
    expect(new Set(anonymous.map((r) => r.status))).toEqual(new Set([401]));
    const res = await request(t.url).get('/orders').set('X-Forwarded-For', address).set('Authorization', bearer(ALICE));
    expect(res.status).toBe(200);
  });
});

describe('without TRUST_PROXY, X-Forwarded-For is the client writing: ignored', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp({ PSP_WEBHOOK_URL: 'none' });
  });
  afterAll(async () => {
    await t?.close();
  });

  it('a guesser cannot dodge the limit by writing a new X-Forwarded-For on each try', async () => {
    const statuses = [];
    for (let i = 0; i <= FAILED_AUTHENTICATIONS_PER_MINUTE; i++) {
      const res = await request(t.url)
        .get('/orders')
        .set('X-Forwarded-For', `198.51.100.${i}`)
        .set('Authorization', `Bearer guess-${i}-0123456789abcdef`);
      statuses.push(res.status);
    }
    expect(statuses.at(-1)).toBe(429);
    expect(statuses.slice(0, -1)).toEqual(Array(FAILED_AUTHENTICATIONS_PER_MINUTE).fill(401));
  });
});
