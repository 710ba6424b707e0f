/**
 * The production start path (main.ts → applyMigrations on the app's own DataSource) must leave
 * the pool as it found it: a request that waits on a row lock afterwards is still bounded by
 * lock_timeout = IDEMPOTENCY_WAIT_MS, not by the 30 s statement timeout.
 */
import { randomUUID } from 'node:crypto';
import { Client } from 'pg';
import request from 'supertest';
import { type ServiceProcess, startServiceProcess } from './support/service-process';
import { ALICE, bearer, createTestDatabase, ignoreIdleErrors } from './support/test-app';

/**
 * Well above IDEMPOTENCY_WAIT_MS plus a loaded machine's latency, below the 30 s statement timeout a leaked lock_timeout = 0 would reach.
 */
const ANSWER_DEADLINE_MS = 20_000;

describe('the service after applying migrations at start-up', () => {
  let database: { url: string; drop(): Promise<void> };
  let service: ServiceProcess | undefined;
  let holder: Client | undefined;

  beforeAll(async () => {
    database = await createTestDatabase();
  });
  afterAll(async () => {
    await service?.kill('SIGKILL');
    await holder?.end().catch(() => undefined);
    await database?.drop();
  });

  it('a duplicate that must wait on a held key gets 409 + Retry-After after IDEMPOTENCY_WAIT_MS, then replays', async () => {
    // Two pooled connections: the one migrations used is surely the one the request gets.
    service = await startServiceProcess({
      DATABASE_URL: database.url,
      API_KEYS: `${ALICE.clientId}:${ALICE.secret}`,
      DATABASE_POOL_SIZE: '2',
      IDEMPOTENCY_WAIT_MS: '300',
    });
    const key = randomUUID();
    const body = { currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 100 }], note: 'after-migrations' };
    // Exactly what a first request in flight has done: taken the key's lock, not yet committed.
    holder = ignoreIdleErrors(new Client({ connectionString: database.url }));
    await holder.connect();
    await holder.query('BEGIN');
    await holder.query(`SELECT pg_advisory_xact_lock(hashtext('alice'), hashtext($1))`, [key]);
    const post = () =>
      request(service!.url)
        .post('/orders')
        .set('Authorization', bearer(ALICE))
        .set('Idempotency-Key', key)
        .timeout(ANSWER_DEADLINE_MS)
        .send(body);

    // Each request in turn, so each takes the connection the previous one released (the migration's one among them).
    for (let i = 0; i < 3; i++) {
      const res = await post();
      expect(res.status).toBe(409);
      expect(res.headers['retry-after']).toBe('1');
      expect(res.body).toMatchObject({ title: 'A request is outstanding for this Idempotency-Key' });
    }

    await holder.query('ROLLBACK');
    const created = await post();
    expect(created.status).toBe(201);
    const replayed = await post();
    expect(replayed.status).toBe(201);
    expect(replayed.headers['idempotent-replayed']).toBe('true');
    expect(replayed.text).toBe(created.text);
  });
});
