/**
 * Stored answers encrypted at rest (IDEMPOTENCY_ENCRYPTION_KEYS): the service as `npm start` runs it, restarted
 * with a rotated key. A replay under the new key is the first answer byte for byte; the row holds none of the
 * order's personal data in plain text; an answer whose key was removed is a clear 503, never a second effect.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { Pool } from 'pg';
import request from 'supertest';
import { runServiceToExit, type ServiceProcess, startServiceProcess } from './support/service-process';
import { ALICE, bearer, createTestDatabase } from './support/test-app';

/** Three service starts on a loaded 2-core machine: a budget, not a claim. */
const TIMEOUT_MS = 240_000;

const K1 = randomBytes(32).toString('base64');
const K2 = randomBytes(32).toString('base64');

describe('stored answers encrypted at rest, with key rotation', () => {
  let database: { url: string; drop(): Promise<void> };
  let db: Pool;
  let service: ServiceProcess | undefined;
  const start = async (keys: string) => {
    await service?.kill('SIGTERM');
    service = await startServiceProcess({
      DATABASE_URL: database.url,
      API_KEYS: `${ALICE.clientId}:${ALICE.secret}`,
      IDEMPOTENCY_ENCRYPTION_KEYS: keys,
    });
    return service.url;
  };

  beforeAll(async () => {
    database = await createTestDatabase();
    db = new Pool({ connectionString: database.url, max: 2 });
  });
  afterAll(async () => {
    await service?.kill('SIGKILL');
    await db?.end();
    await database?.drop();
  });

  const marker = randomUUID();
  const personal = {
    name: `Ada Lovelace ${marker}`,
    line1: `12 St James Square ${marker}`,
    city: 'London',
    postalCode: 'SW1Y 4JH',
    country: 'GB',
  };
  const order = {
    currency: 'EUR',
    items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 1999 }],
    shippingAddress: personal,
    note: `leave it with the neighbour ${marker}`,
  };
  const create = (url: string, key: string, body: object = order) =>
    request(url).post('/orders').set('Authorization', bearer(ALICE)).set('Idempotency-Key', key).send(body);
  const keyRow = async (key: string) =>
    (
      await db.query<{ whole_row: string; response_key_id: string | null }>(
        `SELECT k::text AS whole_row, response_key_id FROM idempotency_keys k WHERE client_id = $1 AND key = $2`,
        [ALICE.clientId, key],
      )
    ).rows[0];

  it(
    'replays under a rotated key byte for byte, keeps no plain text in the row, and refuses clearly once the key is gone',
    async () => {
      const keyOfFirst = randomUUID();
      let url = await start(`k1:${K1}`);
      const first = await create(url, keyOfFirst);
      expect(first.status).toBe(201);
      expect(first.text).toContain(marker);

      // The row: sealed with k1, and none of the order's personal data readable in any column.
      const stored = await keyRow(keyOfFirst);
      expect(stored.response_key_id).toBe('k1');
      expect(stored.whole_row).not.toContain(marker);
      expect(stored.whole_row).not.toContain('Lovelace');

      // Rotated: k2 seals from now on, k1 is kept for reading.
      url = await start(`k2:${K2},k1:${K1}`);
      const replay = await create(url, keyOfFirst);
      expect(replay.status).toBe(201);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.text).toBe(first.text);
      expect(replay.headers['location']).toBe(first.headers['location']);
      expect(replay.headers['etag']).toBe(first.headers['etag']);
      expect(replay.headers['content-type']).toBe(first.headers['content-type']);
      // The second replay comes from the replay cache: the same bytes again.
      const cached = await create(url, keyOfFirst);
      expect(cached.text).toBe(first.text);

      const keyOfSecond = randomUUID();
      const second = await create(url, keyOfSecond, { ...order, orderNumber: `second-${marker}` });
      expect(second.status).toBe(201);
      expect((await keyRow(keyOfSecond)).response_key_id).toBe('k2');
      // A phased handler's answer (a payment: AtomicPhases) is sealed and replayed the same way.
      const keyOfPayment = randomUUID();
      const pay = () =>
        request(url)
          .post(`/orders/${second.body.id as string}/payments`)
          .set('Authorization', bearer(ALICE))
          .set('Idempotency-Key', keyOfPayment)
          .send({ source: 'tok_visa' });
      const paid = await pay();
      expect(paid.status).toBe(201);
      expect((await keyRow(keyOfPayment)).response_key_id).toBe('k2');
      expect((await pay()).text).toBe(paid.text);

      // k1 removed while a row still needs it: a clear 503 that names the cause, and nothing runs again.
      url = await start(`k2:${K2}`);
      const unreadable = await create(url, keyOfFirst);
      expect(unreadable.status).toBe(503);
      expect(unreadable.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(unreadable.body).toMatchObject({ status: 503, title: 'The stored answer cannot be read' });
      expect(unreadable.body.detail).toContain('k1');
      expect(service!.output()).toContain('k1');
      expect((await create(url, keyOfSecond, { ...order, orderNumber: `second-${marker}` })).text).toBe(second.text);
      const { rows } = await db.query(`SELECT count(*)::int AS n FROM orders WHERE note = $1`, [order.note]);
      expect(rows[0].n).toBe(2);
    },
    TIMEOUT_MS,
  );

  it('refuses to start with a malformed key, naming the variable and never printing the key', async () => {
    const short = randomBytes(16).toString('base64');
    const { code, output } = await runServiceToExit(
      {
        DATABASE_URL: database.url,
        API_KEYS: `${ALICE.clientId}:${ALICE.secret}`,
        PSP_SANDBOX: 'in-process',
        IDEMPOTENCY_ENCRYPTION_KEYS: `k1:${short}`,
      },
      { deadlineMs: 30_000 },
    );
    expect(code).not.toBe(0);
    expect(output).toContain('IDEMPOTENCY_ENCRYPTION_KEYS');
    expect(output).not.toContain(short);
  });
});
