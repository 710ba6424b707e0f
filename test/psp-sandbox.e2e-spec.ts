import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { AnswerDelays } from '#psp-sandbox';
import { ALICE, bearer, PSP_AUTH, PSP_KEY, startTestApp, type TestApp } from './support/test-app';

/**
 * The sandbox provider, mounted in-process (PSP_BASE_URL unset) and called over real HTTP.
 * PSP_TIMEOUT_MS is 1 s: tok_timeout / tok_lost hold their answers for 3 s, far longer than
 * the few requests each ordering check needs even on a loaded machine. No duration is asserted.
 */
const TIMEOUT_MS = 1_000;

/** Polls `check` until it is true or the deadline passes: synchronisation without sleeps. */
async function until(check: () => Promise<boolean> | boolean, what: string, deadlineMs = 10_000): Promise<void> {
  const deadline = Date.now() + deadlineMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const chargeBody = (source: string, overrides: Record<string, unknown> = {}) => ({
  amountMinor: 2599,
  currency: 'EUR',
  source,
  metadata: { orderId: randomUUID(), paymentId: randomUUID() },
  ...overrides,
});

interface Pending {
  settled: () => boolean;
  result: Promise<{ status: number; text: string }>;
  abort(): void;
}

/** A POST whose answer we do not await yet (fetch, so it can be aborted like a client's timeout). */
function pendingPost(url: string, key: string, body: unknown): Pending {
  const controller = new AbortController();
  let done = false;
  const result = fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key, authorization: PSP_AUTH },
    body: JSON.stringify(body),
    signal: controller.signal,
  })
    .then(async (res) => ({ status: res.status, text: await res.text() }))
    .finally(() => (done = true));
  return { settled: () => done, result, abort: () => controller.abort() };
}

describe('psp sandbox (/psp)', () => {
  let t: TestApp;
  let delays: AnswerDelays;
  beforeAll(async () => {
    // The sandbox's own webhooks stay undelivered: these charges name payments the service never made, and a service that
    // hears of one refunds it (a payment lost in a failover: lost-payments.e2e-spec.ts), which would change the ledgers read here.
    t = await startTestApp({ PSP_TIMEOUT_MS: String(TIMEOUT_MS), PSP_WEBHOOK_URL: 'none', PROVIDER_SWEEP_INTERVAL_MS: '0' });
    delays = t.app.get(AnswerDelays);
  });
  afterAll(async () => {
    await t?.close();
  });

  const postCharge = (key: string | undefined, body: unknown) => {
    const req = request(t.url).post('/psp/charges').set('Authorization', PSP_AUTH);
    if (key !== undefined) void req.set('Idempotency-Key', key);
    return req.send(body as object);
  };
  const postRefund = (key: string, body: unknown) =>
    request(t.url)
      .post('/psp/refunds')
      .set('Authorization', PSP_AUTH)
      .set('Idempotency-Key', key)
      .send(body as object);
  const refundBody = (chargeId: string, amountMinor: number) => ({
    chargeId,
    amountMinor,
    metadata: { refundId: randomUUID(), paymentId: randomUUID() },
  });
  const count = async (sql: string, params: unknown[] = []) => (await t.db.query(sql, params)).rows[0].n as number;
  const chargesOfPayment = (paymentId: string) => count(`SELECT count(*)::int AS n FROM psp.charges WHERE payment_id = $1`, [paymentId]);
  const keyRows = (key: string) => count(`SELECT count(*)::int AS n FROM psp.idempotency_keys WHERE key = $1`, [key]);
  const lookup = async (query: string) => {
    const res = await request(t.url).get(`/psp/charges?${query}`).set('Authorization', PSP_AUTH);
    expect(res.status).toBe(200);
    return res.body.items as { id: string }[];
  };
  const expectProblem = (res: request.Response, status: number, type?: string) => {
    expect(res.status).toBe(status);
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(res.body.status).toBe(status);
    if (type) expect(res.body.type).toBe(`urn:idempotent-orders:problem:${type}`);
  };
  const charge = async (source: string, overrides: Record<string, unknown> = {}) => {
    const res = await postCharge(randomUUID(), chargeBody(source, overrides));
    expect(res.status).toBe(201);
    return res.body as { id: string; amountMinor: number; metadata: { paymentId: string } };
  };

  describe('charges', () => {
    it('tok_visa: 201 with the charge, recorded, found by orderId and paymentId; a replay is byte-identical and charges once', async () => {
      const key = randomUUID();
      const body = chargeBody('tok_visa');
      const first = await postCharge(key, body);
      expect(first.status).toBe(201);
      expect(first.headers['content-type']).toMatch(/^application\/json/);
      expect(first.body).toEqual({
        id: expect.stringMatching(/^ch_[0-9a-f]{24}$/),
        status: 'succeeded',
        amountMinor: 2599,
        currency: 'EUR',
        source: 'tok_visa',
        failureCode: null,
        metadata: body.metadata,
        createdAt: expect.any(String),
      });
      expect(first.headers['idempotent-replayed']).toBeUndefined();
      // Keys in another order are the same request.
      const again = await postCharge(key, { metadata: body.metadata, source: 'tok_visa', currency: 'EUR', amountMinor: 2599 });
      expect(again.status).toBe(201);
      expect(again.text).toBe(first.text);
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(await chargesOfPayment(body.metadata.paymentId)).toBe(1);
      expect(await keyRows(key)).toBe(1);
      expect(await lookup(`orderId=${body.metadata.orderId}`)).toEqual([first.body]);
      expect(await lookup(`paymentId=${body.metadata.paymentId.toUpperCase()}`)).toEqual([first.body]);
      expect(await lookup(`orderId=${body.metadata.orderId}&paymentId=${randomUUID()}`)).toEqual([]);
    });

    it("metadata.deploymentId: kept as given, returned by the answer, the lookup and the listing, and in the webhook's data; absent when not given", async () => {
      const deploymentId = `orders-${randomUUID()}`;
      const body = chargeBody('tok_visa');
      const tagged = await postCharge(randomUUID(), { ...body, metadata: { ...body.metadata, deploymentId } });
      expect(tagged.status).toBe(201);
      expect(tagged.body.metadata).toEqual({ ...body.metadata, deploymentId });
      expect(await lookup(`paymentId=${body.metadata.paymentId}`)).toEqual([tagged.body]);
      const since = new Date(Date.parse(tagged.body.createdAt) - 1).toISOString();
      expect(await lookup(`createdAfter=${since}`)).toContainEqual(tagged.body);
      const untagged = await charge('tok_visa');
      expect(Object.keys(untagged.metadata).sort()).toEqual(['orderId', 'paymentId']);
      const events = await t.db.query<{ data: Record<string, unknown> }>(
        `SELECT payload AS data FROM psp.webhook_outbox WHERE payload->>'chargeId' = ANY($1)`,
        [[tagged.body.id, untagged.id]],
      );
      expect(events.rows.map((e) => e.data.deploymentId).sort()).toEqual([deploymentId, undefined]);
      for (const bad of ['', 'has space', 'x'.repeat(65), 42, null]) {
        const res = await postCharge(randomUUID(), { ...body, metadata: { ...chargeBody('tok_visa').metadata, deploymentId: bad } });
        expectProblem(res, 400);
        expect(res.body.detail).toMatch(/deploymentId/);
      }
    });

    it('20 concurrent requests with one key make one charge, and all get the same answer', async () => {
      const key = randomUUID();
      const body = chargeBody('tok_visa');
      const answers = await Promise.all(Array.from({ length: 20 }, () => postCharge(key, body)));
      expect(answers.map((a) => a.status)).toEqual(Array(20).fill(201));
      expect(new Set(answers.map((a) => a.text)).size).toBe(1);
      expect(answers.filter((a) => a.headers['idempotent-replayed'] === undefined)).toHaveLength(1);
      expect(await chargesOfPayment(body.metadata.paymentId)).toBe(1);
      expect(await keyRows(key)).toBe(1);
    });

    it('the same key with another body → 422, nothing recorded; the first answer still replays', async () => {
      const key = randomUUID();
      const body = chargeBody('tok_visa');
      const first = await postCharge(key, body);
      expect(first.status).toBe(201);
      const other = chargeBody('tok_visa');
      expectProblem(await postCharge(key, { ...body, amountMinor: 2600 }), 422, 'psp-idempotency-key-reused');
      expectProblem(await postCharge(key, other), 422, 'psp-idempotency-key-reused');
      // Concurrent other bodies on a fresh key: one wins, the rest are 422, one charge.
      const fresh = randomUUID();
      const bodies = Array.from({ length: 6 }, (_, i) => ({ ...other, amountMinor: 100 + i }));
      const raced = await Promise.all(bodies.map((b) => postCharge(fresh, b)));
      expect(raced.filter((r) => r.status === 201)).toHaveLength(1);
      expect(raced.filter((r) => r.status === 422)).toHaveLength(5);
      expect(await chargesOfPayment(other.metadata.paymentId)).toBe(1);
      expect(await chargesOfPayment(body.metadata.paymentId)).toBe(1);
      // A charge's key cannot be reused for a refund either.
      expectProblem(await postRefund(key, refundBody(first.body.id, 1)), 422, 'psp-idempotency-key-reused');
      expect(await count(`SELECT count(*)::int AS n FROM psp.refunds WHERE charge_id = $1`, [first.body.id])).toBe(0);
      const replay = await postCharge(key, body);
      expect(replay.text).toBe(first.text);
    });

    it('tok_chargeDeclined: 402 failed card_declined, recorded and replayed', async () => {
      const key = randomUUID();
      const body = chargeBody('tok_chargeDeclined');
      const first = await postCharge(key, body);
      expect(first.status).toBe(402);
      expect(first.headers['content-type']).toMatch(/^application\/json/);
      expect(first.body).toMatchObject({
        status: 'failed',
        failureCode: 'card_declined',
        source: 'tok_chargeDeclined',
        metadata: body.metadata,
      });
      const again = await postCharge(key, body);
      expect(again.status).toBe(402);
      expect(again.text).toBe(first.text);
      expect(await lookup(`paymentId=${body.metadata.paymentId}`)).toEqual([first.body]);
      expect(await chargesOfPayment(body.metadata.paymentId)).toBe(1);
    });

    it('tok_unavailable: 503 without Retry-After every time, nothing recorded', async () => {
      const key = randomUUID();
      const body = chargeBody('tok_unavailable');
      for (let i = 0; i < 3; i++) {
        const res = await postCharge(key, body);
        expectProblem(res, 503, 'psp-unavailable');
        expect(res.headers['retry-after']).toBeUndefined();
      }
      expect(await chargesOfPayment(body.metadata.paymentId)).toBe(0);
      expect(await keyRows(key)).toBe(0);
    });

    it('tok_flaky: 503 on the first 2 attempts of a key (nothing recorded), the 3rd succeeds, later ones replay it', async () => {
      const key = randomUUID();
      const body = chargeBody('tok_flaky');
      for (let i = 0; i < 2; i++) {
        const res = await postCharge(key, body);
        expectProblem(res, 503, 'psp-unavailable');
        expect(res.headers['retry-after']).toBeUndefined();
        expect(await chargesOfPayment(body.metadata.paymentId)).toBe(0);
        expect(await keyRows(key)).toBe(0);
      }
      const third = await postCharge(key, body);
      expect(third.status).toBe(201);
      const fourth = await postCharge(key, body);
      expect(fourth.status).toBe(201);
      expect(fourth.text).toBe(third.text);
      expect(await chargesOfPayment(body.metadata.paymentId)).toBe(1);
      // Counted per key: another key starts again at attempt 1.
      expect((await postCharge(randomUUID(), body)).status).toBe(503);
    });

    it('tok_flaky under 10 concurrent attempts of one key: exactly 2 fail, the rest share one charge', async () => {
      const key = randomUUID();
      const body = chargeBody('tok_flaky');
      const answers = await Promise.all(Array.from({ length: 10 }, () => postCharge(key, body)));
      expect(answers.filter((a) => a.status === 503)).toHaveLength(2);
      const ok = answers.filter((a) => a.status === 201);
      expect(ok).toHaveLength(8);
      expect(new Set(ok.map((a) => a.text)).size).toBe(1);
      expect(await chargesOfPayment(body.metadata.paymentId)).toBe(1);
      expect(await count(`SELECT attempts AS n FROM psp.fault_attempts WHERE idempotency_key = $1`, [key])).toBe(10);
    });

    it('tok_timeout: records at once; a second attempt answers at once with that charge while the first is still held', async () => {
      const key = randomUUID();
      const body = chargeBody('tok_timeout');
      const first = pendingPost(`${t.url}/psp/charges`, key, body);
      await until(async () => (await lookup(`paymentId=${body.metadata.paymentId}`)).length === 1, 'the charge is recorded');
      const second = await postCharge(key, body);
      expect(second.status).toBe(201);
      expect(second.headers['idempotent-replayed']).toBe('true');
      expect(first.settled()).toBe(false);
      const firstAnswer = await first.result;
      expect(firstAnswer.status).toBe(201);
      expect(firstAnswer.text).toBe(second.text);
      expect(await chargesOfPayment(body.metadata.paymentId)).toBe(1);
    });

    it('tok_lost: the charge is visible through GET at once while the POST waits; every answer is held back', async () => {
      const key = randomUUID();
      const body = chargeBody('tok_lost');
      const first = pendingPost(`${t.url}/psp/charges`, key, body);
      let found: { id: string }[] = [];
      await until(async () => (found = await lookup(`orderId=${body.metadata.orderId}`)).length === 1, 'the lost charge is visible');
      expect(first.settled()).toBe(false);
      expect(found[0]).toMatchObject({ status: 'succeeded', source: 'tok_lost' });
      const answer = await first.result;
      expect(answer.status).toBe(201);
      expect(JSON.parse(answer.text)).toEqual(found[0]);
      // A retry is held back too (a timer is pending for it), and hanging up ends that timer.
      const retry = pendingPost(`${t.url}/psp/charges`, key, body);
      await until(() => delays.size === 1 || retry.settled(), 'the retry is held back');
      expect(retry.settled()).toBe(false);
      retry.abort();
      await expect(retry.result).rejects.toThrow();
      await until(() => delays.size === 0, 'the hung-up answer is dropped');
      expect(await chargesOfPayment(body.metadata.paymentId)).toBe(1);
    });

    it('tok_slow: succeeds, answered after PSP_TIMEOUT_MS / 2; other tokens are not held', async () => {
      // Records every hold the controller asks for (a spy by hand: the delay itself still runs).
      const holds: number[] = [];
      const wait = delays.wait.bind(delays);
      delays.wait = (ms, gone) => {
        holds.push(ms);
        return wait(ms, gone);
      };
      try {
        const slow = await charge('tok_slow');
        expect(slow).toMatchObject({ status: 'succeeded' });
        expect(holds).toEqual([TIMEOUT_MS / 2]);
        await charge('tok_visa');
        expect(holds).toEqual([TIMEOUT_MS / 2, 0]);
      } finally {
        delays.wait = wait;
      }
    });

    it('tok_processing: worked on for PSP_TIMEOUT_MS / 2 before anything is recorded (no charge, no event), then answered at once', async () => {
      const body = chargeBody('tok_processing');
      const events = () =>
        count(`SELECT count(*)::int AS n FROM psp.webhook_outbox WHERE payload ->> 'paymentId' = $1`, [body.metadata.paymentId]);
      // What exists when each hold ends, read inside the sandbox's own flow (the hold still runs).
      const holds: { ms: number; charges: number; events: number }[] = [];
      const wait = delays.wait.bind(delays);
      delays.wait = async (ms, gone) => {
        const elapsed = await wait(ms, gone);
        holds.push({ ms, charges: await chargesOfPayment(body.metadata.paymentId), events: await events() });
        return elapsed;
      };
      try {
        const key = randomUUID();
        const res = await postCharge(key, body);
        expect(res.status).toBe(201);
        expect(res.body).toMatchObject({ status: 'succeeded', source: 'tok_processing' });
        // The one hold came before the charge and its event; the answer itself was not held.
        expect(holds).toEqual([
          { ms: TIMEOUT_MS / 2, charges: 0, events: 0 },
          { ms: 0, charges: 1, events: 1 },
        ]);
        expect(await chargesOfPayment(body.metadata.paymentId)).toBe(1);
      } finally {
        delays.wait = wait;
      }
    });

    it('tok_processing: a client that hangs up while its request is worked on leaves nothing recorded', async () => {
      const key = randomUUID();
      const body = chargeBody('tok_processing');
      const first = pendingPost(`${t.url}/psp/charges`, key, body);
      await until(() => delays.size === 1 || first.settled(), 'the request is being worked on');
      expect(first.settled()).toBe(false);
      first.abort();
      await expect(first.result).rejects.toThrow();
      await until(() => delays.size === 0, 'the hung-up request is dropped');
      expect(await chargesOfPayment(body.metadata.paymentId)).toBe(0);
      expect(await keyRows(key)).toBe(0);
      // The key is still free: sent again, it is worked on and recorded once.
      expect((await postCharge(key, body)).status).toBe(201);
      expect(await chargesOfPayment(body.metadata.paymentId)).toBe(1);
    });

    it('an unknown token → 400 invalid source, nothing recorded', async () => {
      const key = randomUUID();
      const body = chargeBody('tok_nope');
      const res = await postCharge(key, body);
      expectProblem(res, 400, 'psp-unknown-source');
      for (const source of ['toString', '__proto__', 'constructor'])
        expectProblem(await postCharge(randomUUID(), chargeBody(source)), 400, 'psp-unknown-source');
      expect(await chargesOfPayment(body.metadata.paymentId)).toBe(0);
      expect(await keyRows(key)).toBe(0);
    });

    it('bad bodies and keys → 400 problem+json, nothing recorded', async () => {
      const base = chargeBody('tok_visa');
      const bad: unknown[] = [
        { ...base, amountMinor: 0 },
        { ...base, amountMinor: -5 },
        { ...base, amountMinor: 1.5 },
        { ...base, amountMinor: '100' },
        { ...base, amountMinor: 2 ** 53 },
        { ...base, amountMinor: 1e300 },
        { ...base, currency: 'eur' },
        { ...base, currency: 'EURO' },
        { ...base, metadata: { orderId: 'not-a-uuid', paymentId: base.metadata.paymentId } },
        { ...base, metadata: { orderId: base.metadata.orderId } },
        { ...base, metadata: [base.metadata] },
        { ...base, metadata: 'x' },
        { ...base, metadata: undefined },
        { ...base, extra: true },
        { ...base, metadata: { ...base.metadata, extra: 1 } },
        { ...base, source: 42 },
        [],
      ];
      for (const body of bad) expectProblem(await postCharge(randomUUID(), body), 400);
      expectProblem(await postCharge(undefined, base), 400, 'idempotency-key-missing');
      expectProblem(await postCharge('a b', base), 400, 'idempotency-key-malformed');
      expectProblem(await postCharge('x'.repeat(256), base), 400, 'idempotency-key-malformed');
      const notJson = await request(t.url)
        .post('/psp/charges')
        .set('Authorization', PSP_AUTH)
        .set('Idempotency-Key', randomUUID())
        .set('Content-Type', 'application/json')
        .send('{"amountMinor":');
      expect(notJson.status).toBe(400);
      expect(await chargesOfPayment(base.metadata.paymentId)).toBe(0);
      // Lookups too.
      for (const query of ['', 'orderId=nope', 'paymentId=1', 'other=1'])
        expectProblem(await request(t.url).get(`/psp/charges?${query}`).set('Authorization', PSP_AUTH), 400);
      for (const query of ['', 'chargeId=nope', 'refundId=1'])
        expectProblem(await request(t.url).get(`/psp/refunds?${query}`).set('Authorization', PSP_AUTH), 400);
    });

    it("needs the provider's secret key, not a client's API key: anything else is 401 problem+json, and nothing is recorded", async () => {
      const body = chargeBody('tok_chargeDeclined');
      const strangers = [
        undefined,
        'Bearer',
        `Bearer ${PSP_KEY}x`,
        `Bearer ${PSP_KEY.slice(0, -1)}`,
        `Bearer ${PSP_KEY} ${PSP_KEY}`,
        PSP_KEY,
        `Basic ${Buffer.from(`merchant:${PSP_KEY}`).toString('base64')}`,
        bearer(ALICE),
      ];
      for (const authorization of strangers) {
        const as = (req: request.Test) => (authorization === undefined ? req : req.set('Authorization', authorization));
        const answers = [
          await as(request(t.url).post('/psp/charges').set('Idempotency-Key', randomUUID())).send(body),
          await as(request(t.url).get('/psp/charges').query({ paymentId: body.metadata.paymentId })),
          await as(request(t.url).post('/psp/refunds').set('Idempotency-Key', randomUUID())).send(refundBody('ch_x', 1)),
          await as(request(t.url).get('/psp/refunds').query({ chargeId: 'ch_x' })),
        ];
        for (const res of answers) {
          expectProblem(res, 401, 'unauthorized');
          expect(res.headers['www-authenticate']).toBe('Bearer');
        }
      }
      expect(await chargesOfPayment(body.metadata.paymentId)).toBe(0);
      // The provider key opens the sandbox, and only the sandbox: the service's own API still wants a client's key.
      expect((await postCharge(randomUUID(), chargeBody('tok_visa'))).status).toBe(201);
      expect((await request(t.url).post('/orders').set('Authorization', PSP_AUTH).send({})).status).toBe(401);
    });
  });

  describe('refunds', () => {
    it('8 partial refunds in parallel (different keys) never exceed the charge', async () => {
      const ch = await charge('tok_visa', { amountMinor: 1000 });
      const answers = await Promise.all(Array.from({ length: 8 }, () => postRefund(randomUUID(), refundBody(ch.id, 300))));
      const ok = answers.filter((a) => a.status === 201);
      expect(ok).toHaveLength(3);
      for (const refused of answers.filter((a) => a.status !== 201)) expectProblem(refused, 422, 'psp-refund-exceeds-charge');
      const { rows } = await t.db.query(
        `SELECT refunded_minor, (SELECT coalesce(sum(amount_minor), 0) FROM psp.refunds WHERE charge_id = $1 AND status = 'succeeded') AS refunds FROM psp.charges WHERE id = $1`,
        [ch.id],
      );
      expect(rows[0]).toEqual({ refunded_minor: '900', refunds: '900' });
      expect(await count(`SELECT count(*)::int AS n FROM psp.refunds WHERE charge_id = $1`, [ch.id])).toBe(3);
      // What remains can still be refunded, exactly.
      expect((await postRefund(randomUUID(), refundBody(ch.id, 101))).body.remainingMinor).toBe(100);
      expect((await postRefund(randomUUID(), refundBody(ch.id, 100))).status).toBe(201);
    });

    it('a refund replays byte-identically, is found by chargeId and refundId, and a key reused with another body → 422', async () => {
      const ch = await charge('tok_visa', { amountMinor: 1000 });
      const key = randomUUID();
      const body = refundBody(ch.id, 1000);
      const first = await postRefund(key, body);
      expect(first.status).toBe(201);
      expect(first.body).toEqual({
        id: expect.stringMatching(/^re_[0-9a-f]{24}$/),
        status: 'succeeded',
        chargeId: ch.id,
        amountMinor: 1000,
        failureCode: null,
        metadata: body.metadata,
        createdAt: expect.any(String),
      });
      // Nothing remains, yet the replay answers as before.
      const again = await postRefund(key, body);
      expect(again.status).toBe(201);
      expect(again.text).toBe(first.text);
      expect(again.headers['idempotent-replayed']).toBe('true');
      expectProblem(await postRefund(key, { ...body, amountMinor: 5 }), 422, 'psp-idempotency-key-reused');
      const byCharge = await request(t.url).get(`/psp/refunds?chargeId=${ch.id}`).set('Authorization', PSP_AUTH);
      expect(byCharge.body).toEqual({ items: [first.body] });
      const byRefund = await request(t.url).get(`/psp/refunds?refundId=${body.metadata.refundId}`).set('Authorization', PSP_AUTH);
      expect(byRefund.body).toEqual({ items: [first.body] });
      expect(await count(`SELECT count(*)::int AS n FROM psp.refunds WHERE charge_id = $1`, [ch.id])).toBe(1);
    });

    it('a declined charge cannot be refunded (422), an unknown charge is a 404; nothing recorded', async () => {
      const declined = await postCharge(randomUUID(), chargeBody('tok_chargeDeclined'));
      expect(declined.status).toBe(402);
      const key = randomUUID();
      expectProblem(await postRefund(key, refundBody(declined.body.id, 1)), 422, 'psp-charge-not-refundable');
      expectProblem(await postRefund(randomUUID(), refundBody('ch_000000000000000000000000', 1)), 404, 'psp-charge-not-found');
      expect(await keyRows(key)).toBe(0);
      expect(await count(`SELECT count(*)::int AS n FROM psp.refunds WHERE charge_id = $1`, [declined.body.id])).toBe(0);
    });

    it('tok_refundDeclined: the charge succeeds, its refund is declined (402, recorded, takes nothing) and replayed', async () => {
      const ch = await charge('tok_refundDeclined', { amountMinor: 500 });
      const key = randomUUID();
      const body = refundBody(ch.id, 500);
      const first = await postRefund(key, body);
      expect(first.status).toBe(402);
      expect(first.body).toMatchObject({ status: 'failed', failureCode: 'refund_declined', chargeId: ch.id, amountMinor: 500 });
      const again = await postRefund(key, body);
      expect(again.status).toBe(402);
      expect(again.text).toBe(first.text);
      expect((await t.db.query(`SELECT refunded_minor FROM psp.charges WHERE id = $1`, [ch.id])).rows[0].refunded_minor).toBe('0');
      expect(
        (await request(t.url).get(`/psp/refunds?refundId=${body.metadata.refundId}`).set('Authorization', PSP_AUTH)).body.items,
      ).toEqual([first.body]);
      // Still refused when it asks for more than the charge.
      expectProblem(await postRefund(randomUUID(), refundBody(ch.id, 501)), 422, 'psp-refund-exceeds-charge');
    });

    it("a refund inherits its charge's faults: tok_flaky fails its first 2 attempts per key, tok_timeout holds its first answer", async () => {
      // The flaky charge itself needs 3 attempts.
      const chargeKey = randomUUID();
      const flakyBody = chargeBody('tok_flaky', { amountMinor: 800 });
      await postCharge(chargeKey, flakyBody);
      await postCharge(chargeKey, flakyBody);
      const flaky = await postCharge(chargeKey, flakyBody);
      expect(flaky.status).toBe(201);
      const key = randomUUID();
      const body = refundBody(flaky.body.id, 800);
      expectProblem(await postRefund(key, body), 503, 'psp-unavailable');
      expectProblem(await postRefund(key, body), 503, 'psp-unavailable');
      expect(await keyRows(key)).toBe(0);
      expect((await postRefund(key, body)).status).toBe(201);

      // The tok_timeout charge: its id from a lookup; its own held answer is not needed (hang up).
      const timeoutBody = chargeBody('tok_timeout', { amountMinor: 800 });
      const timeoutCharge = pendingPost(`${t.url}/psp/charges`, randomUUID(), timeoutBody);
      let charges: { id: string }[] = [];
      await until(
        async () => (charges = await lookup(`paymentId=${timeoutBody.metadata.paymentId}`)).length === 1,
        'the charge is recorded',
      );
      timeoutCharge.abort();
      await timeoutCharge.result.catch(() => undefined);
      const timeout = { body: charges[0] };
      const refundKey = randomUUID();
      const refund = refundBody(timeout.body.id, 800);
      const held = pendingPost(`${t.url}/psp/refunds`, refundKey, refund);
      await until(
        async () =>
          (await request(t.url).get(`/psp/refunds?chargeId=${timeout.body.id}`).set('Authorization', PSP_AUTH)).body.items.length === 1,
        'the refund is recorded',
      );
      const second = await postRefund(refundKey, refund);
      expect(second.status).toBe(201);
      expect(held.settled()).toBe(false);
      expect((await held.result).text).toBe(second.text);
    });
  });
});

describe('psp sandbox shutdown', () => {
  it('closing the app drops a held-back answer instead of waiting for it', async () => {
    const t = await startTestApp({ PSP_TIMEOUT_MS: '10000' });
    let closed = false;
    try {
      const delays = t.app.get(AnswerDelays);
      const lost = pendingPost(`${t.url}/psp/charges`, randomUUID(), chargeBody('tok_lost'));
      const outcome = lost.result.then(
        (res) => `answered ${res.status}`,
        () => 'dropped',
      );
      await until(() => delays.size === 1, 'the answer is held back');
      await t.close();
      closed = true;
      // Had the timer kept running, close would have waited 30 s for it and the POST would have got its 201.
      expect(await outcome).toBe('dropped');
      expect(delays.size).toBe(0);
    } finally {
      if (!closed) await t.close();
    }
  });
});
