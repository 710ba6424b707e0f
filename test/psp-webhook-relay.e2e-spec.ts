import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { Webhook } from 'standardwebhooks';
import { WebhookRelay } from '#psp-sandbox';
import { createTestDatabase, PSP_AUTH, startTestApp, type TestApp, WEBHOOK_SECRET } from './support/test-app';

/**
 * The sandbox's webhook SENDER (outbox + relay), against a real HTTP receiver on 127.0.0.1 that
 * records every request and answers as each test scripts it. Every wait is a poll with a deadline;
 * no duration is asserted.
 */

interface Receipt {
  id: string;
  timestamp: string;
  signature: string;
  body: string;
}

/** A webhook receiver: records requests, answers `respond(receipt, nthOfThisId)` (default 200). */
class Receiver {
  readonly received: Receipt[] = [];
  /** The status to answer, or 'hang' to never answer. */
  respond: (receipt: Receipt, nth: number) => number | 'hang' = () => 200;
  private server: Server | undefined;
  port = 0;

  get url(): string {
    return `http://127.0.0.1:${this.port}/hooks`;
  }

  /** Listens (again, on the same port after stop(): the relay keeps the URL it was given). */
  async start(): Promise<this> {
    const server = createServer((req: IncomingMessage, res: ServerResponse) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const receipt = {
          id: String(req.headers['webhook-id']),
          timestamp: String(req.headers['webhook-timestamp']),
          signature: String(req.headers['webhook-signature']),
          body: Buffer.concat(chunks).toString('utf8'),
        };
        this.received.push(receipt);
        const answer = this.respond(receipt, this.of(receipt.id).length);
        if (answer === 'hang') return;
        res.statusCode = answer;
        res.end();
      });
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.port, '127.0.0.1', () => resolve());
    });
    this.server = server;
    this.port = (server.address() as AddressInfo).port;
    return this;
  }

  /** Down: the port refuses connections until start() again. */
  async stop(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    if (!server) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  of(id: string): Receipt[] {
    return this.received.filter((r) => r.id === id);
  }
}

/** Polls `check` until it is true or the deadline passes: synchronisation without sleeps. */
async function until(check: () => Promise<boolean> | boolean, what: string, deadlineMs = 30_000): Promise<void> {
  const deadline = Date.now() + deadlineMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** The Standard Webhooks check a consumer makes; throws on a bad signature. Returns the parsed body. */
function verified(receipt: Receipt): { type: string; timestamp: string; data: Record<string, unknown> } {
  const body = new Webhook(WEBHOOK_SECRET).verify(receipt.body, {
    'webhook-id': receipt.id,
    'webhook-timestamp': receipt.timestamp,
    'webhook-signature': receipt.signature,
  });
  return body as { type: string; timestamp: string; data: Record<string, unknown> };
}

async function post(t: TestApp, path: string, key: string, body: unknown): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(`${t.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key, authorization: PSP_AUTH },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

const chargeBody = (source: string) => ({
  amountMinor: 2599,
  currency: 'EUR',
  source,
  metadata: { orderId: randomUUID(), paymentId: randomUUID() },
});

async function charge(t: TestApp, source: string) {
  const body = chargeBody(source);
  const res = await post(t, '/psp/charges', randomUUID(), body);
  return { ...res, sent: body, id: res.body.id as string };
}

interface OutboxRow {
  id: string;
  copy: number;
  type: string;
  payload: Record<string, unknown>;
  attempts: number;
  delivered_at: Date | null;
  last_error: string | null;
}

const outbox = async (t: TestApp): Promise<OutboxRow[]> =>
  (
    await t.db.query<OutboxRow>(
      `SELECT id, copy, type, payload, attempts, delivered_at, last_error FROM psp.webhook_outbox ORDER BY created_at, id, copy`,
    )
  ).rows;

/** The outbox rows whose data names this charge (charge events and its refunds' events). */
const eventsOfCharge = async (t: TestApp, chargeId: string) => (await outbox(t)).filter((row) => row.payload.chargeId === chargeId);

const allDelivered = async (t: TestApp, expectedRows: number) => {
  const rows = await outbox(t);
  return rows.length === expectedRows && rows.every((row) => row.delivered_at !== null);
};

describe('psp webhook relay (outbox → signed POSTs)', () => {
  const closers: (() => Promise<void>)[] = [];
  /** Everything a test opens is closed after it, even when it fails, newest first. */
  const opened = <T extends { close?: () => Promise<void>; stop?: () => Promise<void> }>(thing: T): T => {
    closers.push(() => (thing.close ? thing.close() : thing.stop!()));
    return thing;
  };
  afterEach(async () => {
    while (closers.length) await closers.pop()!().catch(() => undefined);
  });

  it('delivers exactly one signed event, with the right type and data, per recorded charge and refund (none for a replay or a refused request)', async () => {
    const receiver = opened(await new Receiver().start());
    const t = opened(await startTestApp({ PSP_WEBHOOK_URL: receiver.url }));

    const visa = await charge(t, 'tok_visa');
    expect(visa.status).toBe(201);
    const declined = await charge(t, 'tok_chargeDeclined');
    expect(declined.status).toBe(402);
    // A replay of the same key records nothing new, so it queues nothing new.
    const replayKey = randomUUID();
    const replayBody = chargeBody('tok_visa');
    const first = await post(t, '/psp/charges', replayKey, replayBody);
    expect((await post(t, '/psp/charges', replayKey, replayBody)).body.id).toBe(first.body.id);
    // Refused (unknown token): nothing recorded, no event.
    expect((await charge(t, 'tok_nope')).status).toBe(400);
    const refundMeta = { refundId: randomUUID(), paymentId: visa.sent.metadata.paymentId };
    const refund = await post(t, '/psp/refunds', randomUUID(), { chargeId: visa.id, amountMinor: 599, metadata: refundMeta });
    expect(refund.status).toBe(201);
    const refundable = await charge(t, 'tok_refundDeclined');
    const failedMeta = { refundId: randomUUID(), paymentId: refundable.sent.metadata.paymentId };
    const failedRefund = await post(t, '/psp/refunds', randomUUID(), { chargeId: refundable.id, amountMinor: 100, metadata: failedMeta });
    expect(failedRefund.status).toBe(402);

    // Refused refunds (more than the charge; a failed charge) roll back with everything else: no event.
    expect(
      (
        await post(t, '/psp/refunds', randomUUID(), {
          chargeId: visa.id,
          amountMinor: 999_999,
          metadata: { refundId: randomUUID(), paymentId: randomUUID() },
        })
      ).status,
    ).toBe(422);
    expect(
      (
        await post(t, '/psp/refunds', randomUUID(), {
          chargeId: declined.id,
          amountMinor: 1,
          metadata: { refundId: randomUUID(), paymentId: randomUUID() },
        })
      ).status,
    ).toBe(422);

    // visa, declined, the replayed charge, its refund, tok_refundDeclined's charge and its declined refund.
    await until(() => allDelivered(t, 6), 'all six events are delivered');
    const rows = await outbox(t);
    for (const row of rows) expect(receiver.of(row.id)).toHaveLength(1);
    expect(receiver.received).toHaveLength(6);

    const received = new Map(receiver.received.map((r) => [r.id, verified(r)]));
    const eventFor = (predicate: (data: Record<string, unknown>) => boolean) => {
      const matches = [...received.values()].filter((e) => predicate(e.data));
      expect(matches).toHaveLength(1);
      return matches[0];
    };
    const chargeData = (c: Awaited<ReturnType<typeof charge>>, status: string) => ({
      chargeId: c.id,
      paymentId: c.sent.metadata.paymentId,
      orderId: c.sent.metadata.orderId,
      amountMinor: 2599,
      currency: 'EUR',
      status,
    });
    const visaEvent = eventFor((d) => d.chargeId === visa.id && !('providerRefundId' in d));
    expect(visaEvent.type).toBe('charge.succeeded');
    expect(visaEvent.data).toEqual(chargeData(visa, 'succeeded'));
    expect(Number.isNaN(Date.parse(visaEvent.timestamp))).toBe(false);
    const declinedEvent = eventFor((d) => d.chargeId === declined.id);
    expect(declinedEvent.type).toBe('charge.failed');
    expect(declinedEvent.data).toEqual({ ...chargeData(declined, 'failed'), failureCode: 'card_declined' });
    expect(eventFor((d) => d.chargeId === first.body.id).type).toBe('charge.succeeded');
    const refundEvent = eventFor((d) => d.providerRefundId === refund.body.id);
    expect(refundEvent.type).toBe('refund.succeeded');
    expect(refundEvent.data).toEqual({
      providerRefundId: refund.body.id,
      refundId: refundMeta.refundId,
      chargeId: visa.id,
      paymentId: refundMeta.paymentId,
      orderId: visa.sent.metadata.orderId,
      amountMinor: 599,
      currency: 'EUR',
      status: 'succeeded',
    });
    const failedRefundEvent = eventFor((d) => d.providerRefundId === failedRefund.body.id);
    expect(failedRefundEvent.type).toBe('refund.failed');
    expect(failedRefundEvent.data).toMatchObject({
      refundId: failedMeta.refundId,
      status: 'failed',
      failureCode: 'refund_declined',
      orderId: refundable.sent.metadata.orderId,
    });
    // A signature made with another secret is refused: the check above really checks.
    const forged = {
      ...receiver.received[0],
      signature: new Webhook(`whsec_${Buffer.from('another-secret-of-32-bytes-long!').toString('base64')}`).sign(
        receiver.received[0].id,
        new Date(),
        receiver.received[0].body,
      ),
    };
    expect(() => verified(forged)).toThrow();
  });

  it('retries a receiver answering 500 with the same webhook-id until a 2xx, and records the attempts; /metrics counts them', async () => {
    const receiver = opened(await new Receiver().start());
    receiver.respond = (_receipt, nth) => (nth <= 2 ? 500 : 200);
    const t = opened(await startTestApp({ PSP_WEBHOOK_URL: receiver.url }));

    const visa = await charge(t, 'tok_visa');
    await until(async () => (await eventsOfCharge(t, visa.id))[0]?.delivered_at != null, 'the event is delivered');
    const [row] = await eventsOfCharge(t, visa.id);
    expect(row.attempts).toBe(3);
    expect(row.last_error).toBeNull();
    const receipts = receiver.of(row.id);
    expect(receipts).toHaveLength(3);
    // Every attempt signed afresh, one body.
    for (const receipt of receipts) expect(verified(receipt).data.chargeId).toBe(visa.id);
    expect(new Set(receipts.map((r) => r.body)).size).toBe(1);

    const metrics = await (await fetch(`${t.url}/metrics`)).text();
    expect(metrics).toMatch(/^psp_webhook_deliveries_total\{result="rejected"\} 2$/m);
    expect(metrics).toMatch(/^psp_webhook_deliveries_total\{result="delivered"\} 1$/m);
    expect(metrics).toMatch(/^psp_webhook_outbox_pending 0$/m);
  });

  it('delivers an event written while the receiver is down once it is up', async () => {
    const receiver = opened(await new Receiver().start());
    await receiver.stop();
    const t = opened(await startTestApp({ PSP_WEBHOOK_URL: receiver.url }));

    const visa = await charge(t, 'tok_visa');
    await until(async () => ((await eventsOfCharge(t, visa.id))[0]?.attempts ?? 0) >= 1, 'a delivery has failed');
    const [failed] = await eventsOfCharge(t, visa.id);
    expect(failed.delivered_at).toBeNull();
    expect(failed.last_error).toMatch(/ECONNREFUSED/);
    expect(await (await fetch(`${t.url}/metrics`)).text()).toMatch(/^psp_webhook_outbox_pending 1$/m);

    await receiver.start();
    await until(async () => (await eventsOfCharge(t, visa.id))[0]?.delivered_at != null, 'the event is delivered');
    expect(receiver.of(failed.id)).toHaveLength(1);
    expect(verified(receiver.of(failed.id)[0]).type).toBe('charge.succeeded');
  });

  it('PSP_WEBHOOK_DUPLICATES=true sends every event twice under one webhook-id', async () => {
    const receiver = opened(await new Receiver().start());
    const t = opened(await startTestApp({ PSP_WEBHOOK_URL: receiver.url, PSP_WEBHOOK_DUPLICATES: 'true' }));

    const charges = await Promise.all([charge(t, 'tok_visa'), charge(t, 'tok_visa'), charge(t, 'tok_chargeDeclined')]);
    await until(() => allDelivered(t, 6), 'both copies of the three events are delivered');
    const ids = new Set((await outbox(t)).map((row) => row.id));
    expect(ids.size).toBe(3);
    for (const id of ids) {
      const copies = receiver.of(id);
      expect(copies).toHaveLength(2);
      expect(verified(copies[0])).toEqual(verified(copies[1]));
    }
    expect(new Set([...ids].map((id) => verified(receiver.of(id)[0]).data.chargeId))).toEqual(new Set(charges.map((c) => c.id)));
  });

  it('two relays on one database never both send a row: every webhook-id arrives once', async () => {
    const receiver = opened(await new Receiver().start());
    const database = await createTestDatabase();
    closers.push(() => database.drop());
    const env = { PSP_WEBHOOK_URL: receiver.url };
    const a = opened(await startTestApp(env, { databaseUrl: database.url }));
    const b = opened(await startTestApp(env, { databaseUrl: database.url }));
    expect(a.app.get(WebhookRelay).running && b.app.get(WebhookRelay).running).toBe(true);

    const count = 20;
    await Promise.all(Array.from({ length: count }, (_, i) => charge(i % 2 ? a : b, 'tok_visa')));
    await until(() => allDelivered(a, count), `all ${count} events are delivered`);
    const ids = (await outbox(a)).map((row) => row.id);
    expect(new Set(ids).size).toBe(count);
    for (const id of ids) expect(receiver.of(id)).toHaveLength(1);
    expect(receiver.received).toHaveLength(count);
  });

  it('closing the app aborts a send in flight and hands its row straight back (no lease left to wait out, no attempt counted)', async () => {
    const receiver = opened(await new Receiver().start());
    receiver.respond = () => 'hang';
    // Its own database, kept after close() so the row can be read then.
    const database = await createTestDatabase();
    closers.push(() => database.drop());
    const t = await startTestApp({ PSP_WEBHOOK_URL: receiver.url }, { databaseUrl: database.url });
    closers.push(() => t.close());

    const visa = await charge(t, 'tok_visa');
    const [queued] = await eventsOfCharge(t, visa.id);
    await until(() => receiver.of(queued.id).length === 1, 'the receiver holds the request');
    const db = new pg.Client({ connectionString: t.databaseUrl });
    await db.connect();
    try {
      await t.close();
      const { rows } = await db.query<{ attempts: number; delivered: boolean; due: boolean; last_error: string | null }>(
        `SELECT attempts, delivered_at IS NOT NULL AS delivered, next_attempt_at <= now() AS due, last_error FROM psp.webhook_outbox WHERE id = $1`,
        [queued.id],
      );
      // A send that ran into its 5 s timeout instead would count an attempt and keep the lease 30 s.
      expect(rows).toEqual([{ attempts: 0, delivered: false, due: true, last_error: null }]);
    } finally {
      await db.end();
    }
  });

  it("PSP_WEBHOOK_URL unset delivers to this service's own /webhooks/psp, on the port it listens on", async () => {
    const t = opened(await startTestApp());
    const visa = await charge(t, 'tok_visa');
    await until(async () => ((await eventsOfCharge(t, visa.id))[0]?.attempts ?? 0) >= 1, 'a delivery was attempted');
    const [row] = await eventsOfCharge(t, visa.id);
    // Our own server answered: delivered once the consumer is mounted, Nest's 404 before it. A wrong
    // port would be ECONNREFUSED; not listening yet would be no attempt at all.
    expect(row.delivered_at !== null || row.last_error === 'HTTP 404').toBe(true);
  });

  it('PSP_WEBHOOK_URL=none sends nothing: the relay never starts and the events stay queued', async () => {
    const t = opened(await startTestApp({ PSP_WEBHOOK_URL: 'none' }));
    expect(t.app.get(WebhookRelay).running).toBe(false);
    const visa = await charge(t, 'tok_visa');
    const rows = await eventsOfCharge(t, visa.id);
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({ type: 'charge.succeeded', attempts: 0, delivered_at: null });
  });

  it('listens on a connection of its own, and listens again after that connection is killed', async () => {
    const receiver = opened(await new Receiver().start());
    // Direct to PostgreSQL even in a TEST_PGBOUNCER run (a choice of DATABASE_PREPARED_STATEMENTS keeps the direct URL): behind the pooler
    // it polls instead.
    const t = opened(await startTestApp({ PSP_WEBHOOK_URL: receiver.url, DATABASE_PREPARED_STATEMENTS: 'true' }));
    const listeners = async () =>
      (
        await t.db.query<{ pid: number }>(
          `SELECT pid FROM pg_stat_activity WHERE application_name = 'psp-sandbox-listener' AND datname = current_database()`,
        )
      ).rows.map((r) => r.pid);
    await until(async () => (await listeners()).length === 1, 'the relay listens');
    const [first] = await listeners();
    await t.db.query('SELECT pg_terminate_backend($1)', [first]);
    await until(async () => {
      const now = await listeners();
      return now.length === 1 && now[0] !== first;
    }, 'the relay listens again on a new connection');
    const visa = await charge(t, 'tok_visa');
    await until(async () => (await eventsOfCharge(t, visa.id))[0]?.delivered_at != null, 'the event is delivered');
    expect(receiver.received).toHaveLength(1);
  });

  it('an event not yet delivered when the app stops is delivered by the next app on the same database', async () => {
    const receiver = opened(await new Receiver().start());
    await receiver.stop();
    const database = await createTestDatabase();
    closers.push(() => database.drop());
    const env = { PSP_WEBHOOK_URL: receiver.url };
    const before = await startTestApp(env, { databaseUrl: database.url });
    closers.push(() => before.close());

    const visa = await charge(before, 'tok_visa');
    await until(async () => ((await eventsOfCharge(before, visa.id))[0]?.attempts ?? 0) >= 1, 'a delivery has failed');
    await before.close();
    expect(before.app.get(WebhookRelay).running).toBe(false);

    await receiver.start();
    const after = opened(await startTestApp(env, { databaseUrl: database.url }));
    await until(async () => (await eventsOfCharge(after, visa.id))[0]?.delivered_at != null, 'the event is delivered after the restart');
    const [row] = await eventsOfCharge(after, visa.id);
    expect(receiver.of(row.id)).toHaveLength(1);
    expect(verified(receiver.of(row.id)[0]).data).toMatchObject({ chargeId: visa.id, status: 'succeeded' });
  });
});
