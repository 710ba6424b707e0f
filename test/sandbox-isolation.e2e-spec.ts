/**
 * What one client can do to another through the sandbox provider (issue 38), against the built service started as
 * `npm start` starts it (embedded PostgreSQL, the in-process sandbox, every default), with two API clients.
 * A stranger without the provider key gets 401 from every /psp endpoint, and nothing is recorded or signed for him;
 * one client's fault-simulating test tokens open a breaker of that client's own, never the one every client shares.
 */
import { randomUUID } from 'node:crypto';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client } from 'pg';
import request from 'supertest';
import { freePort } from '../src/common/free-port';
import { type ServiceProcess, startServiceProcess } from './support/service-process';
import { ALICE, BOB, bearer } from './support/test-app';

/** The start (an embedded PostgreSQL of its own), then a few seconds of pays: a budget on a loaded machine, not a claim. */
const TIMEOUT_MS = 180_000;
/** npm start's PSP_BREAKER_THRESHOLD. */
const BREAKER_THRESHOLD = 5;

describe('the sandbox provider of `npm start`, between two clients', () => {
  let dir: string;
  let pgPort: number;
  let service: ServiceProcess | undefined;
  let db: Client;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-sandbox-isolation-'));
    // The server runs as the postgres user (we are root in CI): it must be able to enter the folder.
    await chmod(dir, 0o755);
    pgPort = await freePort();
    // npm start's defaults, the harness's test values undone ('' = unset): two API clients are all that is added.
    service = await startServiceProcess({
      EMBEDDED_PG_DIR: join(dir, 'pg'),
      EMBEDDED_PG_PORT: String(pgPort),
      API_KEYS: `${ALICE.clientId}:${ALICE.secret},${BOB.clientId}:${BOB.secret}`,
      PSP_WEBHOOK_SECRET: '',
      PSP_API_KEY: '',
      PSP_MAX_LATENCY_MS: '',
    });
    db = new Client({ connectionString: `postgres://postgres:postgres@127.0.0.1:${pgPort}/postgres` });
    db.on('error', () => undefined);
    await db.connect();
  }, TIMEOUT_MS);
  afterAll(async () => {
    await db?.end();
    await service?.kill('SIGTERM');
    await rm(dir, { recursive: true, force: true });
  });

  async function createOrder(client: { secret: string }): Promise<string> {
    const res = await request(service!.url)
      .post('/orders')
      .set('Authorization', bearer(client))
      .set('Idempotency-Key', randomUUID())
      .send({ currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 1500 }] });
    expect(res.status).toBe(201);
    return res.body.id as string;
  }
  const pay = (client: { secret: string }, orderId: string, source: string) =>
    request(service!.url)
      .post(`/orders/${orderId}/payments`)
      .set('Authorization', bearer(client))
      .set('Idempotency-Key', randomUUID())
      .send({ source });

  it(
    "a stranger without the provider key is refused at every /psp endpoint, and a client's pending payment stays pending",
    async () => {
      // Bob's payment, pending: the provider never answered (tok_unavailable records nothing).
      const orderId = await createOrder(BOB);
      const pending = await pay(BOB, orderId, 'tok_unavailable');
      expect(pending.status).toBe(503);
      const paymentId = pending.body.paymentId as string;

      const decline = { amountMinor: 1500, currency: 'EUR', source: 'tok_chargeDeclined', metadata: { orderId, paymentId } };
      const strangers: [string, (r: request.Test) => request.Test][] = [
        ['no Authorization', (r) => r],
        ['a guessed key', (r) => r.set('Authorization', 'Bearer sk_test_guessed-key-0123456789')],
        ["another client's API key", (r) => r.set('Authorization', bearer(ALICE))],
      ];
      for (const [who, as] of strangers) {
        const answers = [
          await as(request(service!.url).post('/psp/charges').set('Idempotency-Key', randomUUID())).send(decline),
          await as(request(service!.url).get('/psp/charges').query({ orderId })),
          await as(request(service!.url).get('/psp/charges').query({ paymentId })),
          await as(request(service!.url).post('/psp/refunds').set('Idempotency-Key', randomUUID())).send({
            chargeId: 'ch_0',
            amountMinor: 1,
            metadata: { refundId: randomUUID(), paymentId },
          }),
          await as(request(service!.url).get('/psp/refunds').query({ chargeId: 'ch_0' })),
        ];
        for (const res of answers) {
          expect({ who, status: res.status, type: res.headers['content-type'], problem: res.body.type }).toEqual({
            who,
            status: 401,
            type: expect.stringContaining('application/problem+json'),
            problem: 'urn:idempotent-orders:problem:unauthorized',
          });
          expect(res.headers['www-authenticate']).toBe('Bearer');
        }
      }

      // Nothing was recorded at the provider, so no event can ever be signed for it, and the payment is as it was.
      const { rows: charges } = await db.query(`SELECT count(*)::int AS n FROM psp.charges WHERE payment_id = $1`, [paymentId]);
      const { rows: events } = await db.query(`SELECT count(*)::int AS n FROM psp.webhook_outbox WHERE payload::text LIKE $1`, [
        `%${paymentId}%`,
      ]);
      const { rows: payment } = await db.query(`SELECT status FROM payments WHERE id = $1`, [paymentId]);
      expect({ charges: charges[0].n, events: events[0].n, payment: payment[0].status }).toEqual({
        charges: 0,
        events: 0,
        payment: 'pending',
      });

      // The key the start-up banner prints opens /psp: what a Swagger UI user pastes into "Authorize".
      const printed = /provider key for \/psp[^:]*: (\S+)/.exec(service!.output())?.[1];
      expect(printed).toBeDefined();
      const ledger = await request(service!.url).get('/psp/charges').set('Authorization', `Bearer ${printed}`).query({ paymentId });
      expect({ status: ledger.status, items: ledger.body.items }).toEqual({ status: 200, items: [] });
    },
    TIMEOUT_MS,
  );
  it(
    "one client's tok_unavailable opens that client's breaker only: the other client's tok_visa is charged",
    async () => {
      // Bob's one tok_unavailable above counted against a breaker of his own, if any: these five are Alice's.
      for (let i = 0; i < BREAKER_THRESHOLD; i++) {
        const res = await pay(ALICE, await createOrder(ALICE), 'tok_unavailable');
        expect({ status: res.status, type: res.body.type }).toEqual({ status: 503, type: 'urn:idempotent-orders:problem:payment-pending' });
      }
      // Alice's simulated outage is hers: her next fault token is turned away before anything is written.
      const aliceOrder = await createOrder(ALICE);
      const refused = await pay(ALICE, aliceOrder, 'tok_unavailable');
      expect({ status: refused.status, type: refused.body.type }).toEqual({
        status: 503,
        type: 'urn:idempotent-orders:problem:provider-unavailable',
      });
      const { rows: written } = await db.query(`SELECT count(*)::int AS n FROM payments WHERE order_id = $1`, [aliceOrder]);
      expect(written[0].n).toBe(0);

      // The provider is not down: Bob is charged, and so is Alice with a card that simulates nothing.
      const bobs = await pay(BOB, await createOrder(BOB), 'tok_visa');
      expect({ status: bobs.status, paymentStatus: bobs.body.status }).toEqual({ status: 201, paymentStatus: 'succeeded' });
      const alices = await pay(ALICE, aliceOrder, 'tok_visa');
      expect({ status: alices.status, paymentStatus: alices.body.status }).toEqual({ status: 201, paymentStatus: 'succeeded' });
    },
    TIMEOUT_MS,
  );
});
