import { type INestApplicationContext, Logger, type LoggerService, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { randomUUID } from 'node:crypto';
import { createServer, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Registry } from 'prom-client';
import { monotonicNow } from '@idempotent-orders/idempotency';
import { MetricsModule } from '../src/metrics/metrics.module';
import { type ChargeRequest, MAX_RESPONSE_BYTES, PspClient, type RefundRequest, PspUnreachableError } from '../src/psp-client/psp-client';
import { PspClientMetrics } from '../src/psp-client/psp-client-metrics';
import type { PspClientOptions } from '../src/psp-client/psp-client-options';
import { PspClientModule } from '../src/psp-client/psp-client.module';

/**
 * The outbound client against a real HTTP server on 127.0.0.1, scripted per test. Timing: a
 * response the stub sends at once is given a long timeoutMs (2 s), so load on the machine can never
 * turn it into a timeout and change the attempt count; only tests about timeouts use a short one,
 * with a stub that never answers, so their timeouts are certain.
 */

interface Recorded {
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
  body: string;
  at: number;
  /** The client gave up on it (timeout) before the stub answered. */
  abandoned: boolean;
}

type Handler = (req: IncomingMessage, res: ServerResponse, n: number) => void;

class StubProvider {
  requests: Recorded[] = [];
  private handler: Handler = (_req, res) => reply(res, 500, {});
  private readonly unanswered = new Set<ServerResponse>();
  private readonly server = createServer((req, res) => this.receive(req, res));

  async start(): Promise<void> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
  }

  get baseUrl(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/psp`;
  }

  /** Answers the n-th request (1-based) of the test with `handler`; forgets earlier requests. */
  script(handler: Handler): void {
    this.requests = [];
    this.handler = handler;
  }

  keys(): (string | string[] | undefined)[] {
    return this.requests.map((r) => r.headers['idempotency-key']);
  }

  /**
   * Ends requests still waiting for an answer, so nothing outlives a test. Idle keep-alive sockets
   * stay: closing them under the client would make the next test's first attempt a network error
   * (which the client rightly retries, but which would change that test's attempt count).
   */
  reset(): void {
    this.handler = (_req, res) => reply(res, 500, {});
    for (const res of this.unanswered) res.destroy();
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve, reject) => this.server.close((err) => (err ? reject(err) : resolve())));
  }

  private receive(req: IncomingMessage, res: ServerResponse): void {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const record: Recorded = {
        method: req.method ?? '',
        url: req.url ?? '',
        headers: req.headers,
        body: Buffer.concat(chunks).toString(),
        at: Date.now(),
        abandoned: false,
      };
      const n = this.requests.push(record);
      this.unanswered.add(res);
      res.on('close', () => {
        this.unanswered.delete(res);
        if (!res.writableFinished) record.abandoned = true;
      });
      this.handler(req, res, n);
    });
  }
}

function reply(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  res.writeHead(status, { 'content-type': status >= 400 && status !== 402 ? 'application/problem+json' : 'application/json', ...headers });
  res.end(JSON.stringify(body));
}

const problem = (status: number, detail: string) => ({ type: 'about:blank', title: 'Refused', status, detail });

function chargeRequest(source = 'tok_visa'): ChargeRequest {
  return {
    amountMinor: 1250,
    currency: 'EUR',
    source,
    metadata: { orderId: randomUUID(), paymentId: randomUUID(), deploymentId: randomUUID() },
  };
}

function chargeRecord(body: string, status: 'succeeded' | 'failed' = 'succeeded') {
  const request = JSON.parse(body) as ChargeRequest;
  return {
    id: `ch_${randomUUID()}`,
    status,
    ...request,
    failureCode: status === 'failed' ? 'card_declined' : null,
    createdAt: new Date().toISOString(),
  };
}

type ChargeRecord = ReturnType<typeof chargeRecord>;

/** A charge for `paymentId` of 1250 EUR as a lookup returns it, optionally altered. */
function chargeItem(paymentId: string, alter: (c: ChargeRecord) => unknown = (c) => c): unknown {
  return alter(
    chargeRecord(
      JSON.stringify({ amountMinor: 1250, currency: 'EUR', source: 'tok_visa', metadata: { orderId: randomUUID(), paymentId } }),
    ),
  );
}

function refundRequest(): RefundRequest {
  return { chargeId: `ch_${randomUUID()}`, amountMinor: 500, metadata: { refundId: randomUUID(), paymentId: randomUUID() } };
}

function refundRecord(body: string) {
  const request = JSON.parse(body) as RefundRequest;
  return { id: `re_${randomUUID()}`, status: 'succeeded' as const, ...request, failureCode: null, createdAt: new Date().toISOString() };
}

type RefundRecord = ReturnType<typeof refundRecord>;

/** A lookup's `expected` where the answer holds no record to compare it with. */
const anyCharge = { amountMinor: 1250, currency: 'EUR' };
const anyRefund = () => ({ paymentId: randomUUID(), amountMinor: 500 });

/** The JSON of the charge record for `body`, padded with a field the client ignores to exactly `bytes` bytes. */
function paddedChargeRecord(body: string, bytes: number): string {
  const record = { ...chargeRecord(body), padding: '' };
  const padding = bytes - Buffer.byteLength(JSON.stringify(record));
  return JSON.stringify({ ...record, padding: 'x'.repeat(padding) });
}

function replyRaw(res: ServerResponse, status: number, text: string): void {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(text);
}

/**
 * Sends the start of a lookup answer and then `bytes` more of JSON whitespace in 64 KiB chunks (no
 * content-length: chunked), and never ends it: only a client that stops reading at its limit gets
 * past this before its timeout.
 */
function streamEndlessly(res: ServerResponse, status: number, bytes: number): void {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.write('{"items":[');
  const chunk = Buffer.alloc(64 * 1024, ' ');
  let sent = 0;
  const next = (): void => {
    if (res.destroyed || sent >= bytes) return;
    sent += chunk.length;
    res.write(chunk, next);
  };
  next();
}

/** Answers every charge with its record, as the provider would. */
const succeed: Handler = (req, res) => reply(res, 201, chargeRecord(lastBody(req)));
const hang: Handler = () => undefined;
let stub: StubProvider;
const lastBody = (_req: IncomingMessage) => stub.requests[stub.requests.length - 1].body;

const outboundKey = () => `pay_${randomUUID()}`;
/** The API client a write is made for, and a payment of it made with a card that simulates nothing. */
const CLIENT = 'alice';
const CARD = { clientId: CLIENT, source: 'tok_visa' };
/** The provider's secret key the client sends. */
const PROVIDER_KEY = 'sk_test_stub-provider-key-0123456789';
/** Deadlines are on the monotonic clock (performance.now()), as the client measures them. */
const farDeadline = () => monotonicNow() + 60_000;

class CapturedLogs implements LoggerService {
  entries: { level: string; fields: unknown; message: unknown }[] = [];
  log = (fields: unknown, message?: unknown) => this.entries.push({ level: 'log', fields, message });
  warn = (fields: unknown, message?: unknown) => this.entries.push({ level: 'warn', fields, message });
  error = (fields: unknown, message?: unknown) => this.entries.push({ level: 'error', fields, message });
  debug = (fields: unknown, message?: unknown) => this.entries.push({ level: 'debug', fields, message });
  verbose = (fields: unknown, message?: unknown) => this.entries.push({ level: 'verbose', fields, message });
}
const logs = new CapturedLogs();

/** Error entries raised as alerts (`alert: true`): what must reach a human. */
const alerts = () => logs.entries.filter((e) => e.level === 'error' && (e.fields as { alert?: unknown } | undefined)?.alert === true);

let registry: Registry;

function client(overrides: Partial<PspClientOptions> = {}): PspClient {
  registry = new Registry();
  return new PspClient(
    {
      baseUrl: () => stub.baseUrl,
      apiKey: PROVIDER_KEY,
      timeoutMs: 2_000,
      maxAttempts: 4,
      // High unless a test is about the breaker, so other tests' unknown outcomes never open it.
      breakerThreshold: 1_000,
      breakerHalfOpenMs: 60_000,
      backoffInitialMs: 5,
      backoffMaxMs: 20,
      ...overrides,
    },
    new PspClientMetrics(registry),
  );
}

async function metricValue(name: string, labels: Record<string, string>): Promise<number> {
  const metric = (await registry.getMetricsAsJSON()).find((m) => m.name === name);
  const value = metric?.values.find((v) => Object.entries(labels).every(([k, l]) => v.labels[k] === l));
  return value?.value ?? 0;
}

/** Polls `condition` until it holds or `ms` pass (then the assertion after it fails with its own message). */
async function waitFor(condition: () => boolean, ms = 10_000): Promise<void> {
  const until = Date.now() + ms;
  while (!condition() && Date.now() < until) await new Promise((resolve) => setTimeout(resolve, 10));
}

beforeAll(async () => {
  Logger.overrideLogger(logs);
  stub = new StubProvider();
  await stub.start();
});

afterEach(() => {
  stub.reset();
  logs.entries = [];
});

afterAll(async () => {
  await stub.stop();
});

describe('PspClient writes', () => {
  it('retries 503 twice, then gets the 201, sending the same Idempotency-Key and body every time', async () => {
    stub.script((req, res, n) => (n <= 2 ? reply(res, 503, problem(503, 'down')) : succeed(req, res, n)));
    const key = outboundKey();
    const body = chargeRequest();

    const result = await client().createCharge(body, key, farDeadline(), CLIENT);

    expect(result.kind).toBe('succeeded');
    expect(result.kind === 'succeeded' && result.value.metadata).toEqual(body.metadata);
    expect(stub.requests).toHaveLength(3);
    expect(stub.keys()).toEqual([key, key, key]);
    expect(new Set(stub.requests.map((r) => r.body)).size).toBe(1);
    expect(JSON.parse(stub.requests[0].body)).toEqual(body);
    expect(
      stub.requests.every((r) => r.method === 'POST' && r.url === '/psp/charges' && r.headers['content-type'] === 'application/json'),
    ).toBe(true);
  });

  it('posts a refund to /refunds and maps its 201', async () => {
    const refund = { chargeId: 'ch_1', amountMinor: 500, metadata: { refundId: randomUUID(), paymentId: randomUUID() } };
    stub.script((_req, res) =>
      reply(res, 201, { id: 're_1', status: 'succeeded', failureCode: null, createdAt: new Date().toISOString(), ...refund }),
    );
    const key = outboundKey();

    const result = await client().createRefund(refund, key, farDeadline(), CARD);

    expect(result).toMatchObject({ kind: 'succeeded', value: { id: 're_1', chargeId: 'ch_1', amountMinor: 500 } });
    expect(stub.requests.map((r) => [r.method, r.url, r.headers['idempotency-key']])).toEqual([['POST', '/psp/refunds', key]]);
  });

  it("sends the provider's secret key as Authorization: Bearer with every attempt, of a write and of a lookup", async () => {
    stub.script((req, res, n) => (n === 1 ? reply(res, 503, problem(503, 'down')) : succeed(req, res, n)));
    const psp = client();
    expect((await psp.createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT)).kind).toBe('succeeded');
    const sent = stub.requests.map((r) => r.headers.authorization);
    stub.script((_req, res) => reply(res, 200, { items: [] }));
    await expect(psp.findChargesByPayment(randomUUID(), anyCharge)).resolves.toEqual([]);
    sent.push(...stub.requests.map((r) => r.headers.authorization));
    expect(sent).toEqual([`Bearer ${PROVIDER_KEY}`, `Bearer ${PROVIDER_KEY}`, `Bearer ${PROVIDER_KEY}`]);
  });

  it('maps a 402 with the recorded failed charge to declined, without retrying', async () => {
    stub.script((req, res) => reply(res, 402, chargeRecord(lastBody(req), 'failed')));

    const result = await client().createCharge(chargeRequest('tok_chargeDeclined'), outboundKey(), farDeadline(), CLIENT);

    expect(result).toMatchObject({ kind: 'declined', value: { status: 'failed', failureCode: 'card_declined' } });
    expect(stub.requests).toHaveLength(1);
  });

  it.each([400, 404, 422])('maps %i to refused with the problem detail, without retrying', async (status) => {
    stub.script((_req, res) => reply(res, status, problem(status, `refused with ${status}`)));

    const result = await client().createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT);

    expect(result).toEqual({ kind: 'refused', status, detail: `refused with ${status}` });
    expect(stub.requests).toHaveLength(1);
  });

  it('returns unknown with the last 5xx once every attempt is spent', async () => {
    stub.script((_req, res, n) => reply(res, n % 2 ? 502 : 503, problem(503, 'down')));
    const key = outboundKey();

    const result = await client({ maxAttempts: 4 }).createCharge(chargeRequest(), key, farDeadline(), CLIENT);

    expect(result).toEqual({ kind: 'unknown', reason: 'HTTP 503 after 4 attempts' });
    expect(stub.keys()).toEqual([key, key, key, key]);
  });

  it('retries 409 and 429 like 5xx', async () => {
    stub.script((req, res, n) =>
      n === 1 ? reply(res, 409, problem(409, 'in flight')) : n === 2 ? reply(res, 429, problem(429, 'slow down')) : succeed(req, res, n),
    );

    const result = await client().createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT);

    expect(result.kind).toBe('succeeded');
    expect(stub.requests).toHaveLength(3);
  });

  it('does not retry another status, and does not call it succeeded or refused', async () => {
    stub.script((_req, res) => reply(res, 401, problem(401, 'bad key')));

    const result = await client().createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT);

    expect(result).toEqual({ kind: 'unknown', reason: 'HTTP 401 after 1 attempt' });
    expect(stub.requests).toHaveLength(1);
  });

  it('does not follow a redirect with a payment request', async () => {
    stub.script((_req, res) => reply(res, 307, {}, { location: '/elsewhere' }));

    const result = await client().createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT);

    expect(result.kind).toBe('unknown');
    expect(stub.requests.map((r) => r.url)).toEqual(['/psp/charges']);
  });

  it('calls a 201 whose body is not a charge unknown, never succeeded', async () => {
    stub.script((_req, res) => reply(res, 201, { id: 'ch_1' }));

    const result = await client().createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT);

    expect(result).toEqual({ kind: 'unknown', reason: 'HTTP 201 after 1 attempt' });
  });

  it.each<[string, (c: ChargeRecord) => unknown, string]>([
    ['amountMinor', (c) => ({ ...c, amountMinor: c.amountMinor + 1 }), 'amountMinor 1251 ≠ ours 1250'],
    ['currency', (c) => ({ ...c, currency: 'USD' }), 'currency USD ≠ ours EUR'],
    ['metadata.paymentId', (c) => ({ ...c, metadata: { ...c.metadata, paymentId: 'pay_other' } }), 'metadata.paymentId pay_other ≠ ours '],
    ['metadata.orderId', (c) => ({ ...c, metadata: { ...c.metadata, orderId: 'ord_other' } }), 'metadata.orderId ord_other ≠ ours '],
  ])('calls a 201 with another %s than asked for unknown, raises an alert, and does not retry', async (_field, alter, disagreement) => {
    stub.script((req, res) => reply(res, 201, alter(chargeRecord(lastBody(req)))));
    const key = outboundKey();

    const result = await client().createCharge(chargeRequest(), key, farDeadline(), CLIENT);

    expect(result.kind).toBe('unknown');
    expect(result.kind === 'unknown' && result.reason.startsWith(`the answer does not match the request: ${disagreement}`)).toBe(true);
    expect(stub.requests).toHaveLength(1);
    expect(alerts()).toEqual([
      expect.objectContaining({ fields: expect.objectContaining({ operation: 'charge', outboundKey: key, alert: true }) }),
    ]);
    expect(await metricValue('psp_calls_total', { operation: 'charge', outcome: 'unknown' })).toBe(1);
    expect(await metricValue('psp_calls_total', { operation: 'charge', outcome: 'succeeded' })).toBe(0);
  });

  it('calls a 402 for another amount than asked for unknown too, not declined', async () => {
    stub.script((req, res) => reply(res, 402, { ...chargeRecord(lastBody(req), 'failed'), amountMinor: 99 }));

    const result = await client().createCharge(chargeRequest('tok_chargeDeclined'), outboundKey(), farDeadline(), CLIENT);

    expect(result).toEqual({ kind: 'unknown', reason: 'the answer does not match the request: amountMinor 99 ≠ ours 1250' });
    expect(stub.requests).toHaveLength(1);
    expect(alerts()).toHaveLength(1);
  });

  it.each<[string, (r: RefundRecord) => unknown, string]>([
    ['amountMinor', (r) => ({ ...r, amountMinor: 400 }), 'amountMinor 400 ≠ ours 500'],
    ['chargeId', (r) => ({ ...r, chargeId: 'ch_other' }), 'chargeId ch_other ≠ ours ch_'],
    ['metadata.refundId', (r) => ({ ...r, metadata: { ...r.metadata, refundId: 'ref_other' } }), 'metadata.refundId ref_other ≠ ours '],
  ])(
    'calls a refund 201 with another %s than asked for unknown, raises an alert, and does not retry',
    async (_field, alter, disagreement) => {
      stub.script((req, res) => reply(res, 201, alter(refundRecord(lastBody(req)))));
      const key = outboundKey();

      const result = await client().createRefund(refundRequest(), key, farDeadline(), CARD);

      expect(result.kind).toBe('unknown');
      expect(result.kind === 'unknown' && result.reason.startsWith(`the answer does not match the request: ${disagreement}`)).toBe(true);
      expect(stub.requests).toHaveLength(1);
      expect(alerts()).toEqual([
        expect.objectContaining({ fields: expect.objectContaining({ operation: 'refund', outboundKey: key, alert: true }) }),
      ]);
      expect(await metricValue('psp_calls_total', { operation: 'refund', outcome: 'unknown' })).toBe(1);
      expect(await metricValue('psp_calls_total', { operation: 'refund', outcome: 'succeeded' })).toBe(0);
    },
  );

  it('reads a 201 of exactly MAX_RESPONSE_BYTES', async () => {
    stub.script((req, res) => replyRaw(res, 201, paddedChargeRecord(lastBody(req), MAX_RESPONSE_BYTES)));

    const result = await client().createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT);

    expect(result.kind).toBe('succeeded');
    expect(stub.requests).toHaveLength(1);
  });

  it('calls a 201 over MAX_RESPONSE_BYTES unknown: an unreadable answer, retried like a network error until the attempts are spent', async () => {
    stub.script((req, res) => replyRaw(res, 201, paddedChargeRecord(lastBody(req), MAX_RESPONSE_BYTES + 1)));
    const key = outboundKey();

    const result = await client({ maxAttempts: 3 }).createCharge(chargeRequest(), key, farDeadline(), CLIENT);

    expect(result).toEqual({ kind: 'unknown', reason: `network: the answer's body is over ${MAX_RESPONSE_BYTES} bytes after 3 attempts` });
    expect(stub.keys()).toEqual([key, key, key]);
    expect(await metricValue('psp_attempts_total', { operation: 'charge', result: 'network' })).toBe(3);
    expect(await metricValue('psp_attempts_total', { operation: 'charge', result: '201' })).toBe(0);
  });

  it('retries under the same key when the connection closes in the middle of the body', async () => {
    stub.script((req, res, n) => {
      if (n > 1) return succeed(req, res, n);
      res.writeHead(201, { 'content-type': 'application/json', 'content-length': '500' });
      res.write('{"id":"ch_', () => res.destroy());
    });
    const key = outboundKey();

    const result = await client().createCharge(chargeRequest(), key, farDeadline(), CLIENT);

    expect(result.kind).toBe('succeeded');
    expect(stub.keys()).toEqual([key, key]);
    expect(await metricValue('psp_attempts_total', { operation: 'charge', result: 'network' })).toBe(1);
  });

  it('retries under the same key when the connection drops before any answer', async () => {
    stub.script((req, res, n) => (n === 1 ? req.socket.destroy() : succeed(req, res, n)));
    const key = outboundKey();

    const result = await client().createCharge(chargeRequest(), key, farDeadline(), CLIENT);

    expect(result.kind).toBe('succeeded');
    expect(stub.keys()).toEqual([key, key]);
  });

  it('abandons an attempt that outlasts timeoutMs and retries it under the same key', async () => {
    stub.script((req, res, n) => (n === 1 ? hang(req, res, n) : succeed(req, res, n)));
    const key = outboundKey();
    // Spare attempts, so a slow machine timing out the second one as well still ends in the 201.
    const psp = client({ timeoutMs: 150, maxAttempts: 6 });

    const result = await psp.createCharge(chargeRequest(), key, farDeadline(), CLIENT);

    expect(result.kind).toBe('succeeded');
    expect(stub.requests[0].abandoned).toBe(true);
    expect(new Set(stub.keys())).toEqual(new Set([key]));
    expect(await metricValue('psp_attempts_total', { operation: 'charge', result: 'timeout' })).toBeGreaterThanOrEqual(1);
  });

  it('calls a 422 after an attempt that timed out unknown, not refused: the abandoned attempt may still land', async () => {
    stub.script((req, res, n) => (n === 1 ? hang(req, res, n) : reply(res, 422, problem(422, 'key in use elsewhere'))));
    const result = await client({ timeoutMs: 150, maxAttempts: 3 }).createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT);

    expect(result).toEqual({ kind: 'unknown', reason: 'HTTP 422 after 2 attempts' });
    expect(stub.requests[0].abandoned).toBe(true);
  });

  it('times out an attempt whose body stalls after the headers, since the body is read inside the timeout', async () => {
    stub.script((req, res, n) => {
      if (n > 1) return succeed(req, res, n);
      res.writeHead(201, { 'content-type': 'application/json', 'content-length': '500' });
      res.write('{"id":"ch_');
    });
    const key = outboundKey();

    const result = await client({ timeoutMs: 150, maxAttempts: 6 }).createCharge(chargeRequest(), key, farDeadline(), CLIENT);

    expect(result.kind).toBe('succeeded');
    expect(stub.requests[0].abandoned).toBe(true);
    expect(new Set(stub.keys())).toEqual(new Set([key]));
    expect(await metricValue('psp_attempts_total', { operation: 'charge', result: 'timeout' })).toBeGreaterThanOrEqual(1);
  });

  it('returns unknown when every attempt times out', async () => {
    stub.script(hang);
    const psp = client({ timeoutMs: 150, maxAttempts: 3 });

    const result = await psp.createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT);

    expect(result).toEqual({ kind: 'unknown', reason: 'timeout: no complete answer within 150 ms after 3 attempts' });
    expect(await metricValue('psp_attempts_total', { operation: 'charge', result: 'timeout' })).toBe(3);
    expect(stub.requests.length).toBeLessThanOrEqual(3);
  });

  it('waits out a Retry-After before the next attempt', async () => {
    stub.script((req, res, n) => (n === 1 ? reply(res, 429, problem(429, 'slow down'), { 'retry-after': '1' }) : succeed(req, res, n)));

    const result = await client().createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT);

    expect(result.kind).toBe('succeeded');
    expect(stub.requests).toHaveLength(2);
    // A lower bound, which load cannot break: without Retry-After the backoff here is at most 20 ms.
    expect(stub.requests[1].at - stub.requests[0].at).toBeGreaterThanOrEqual(950);
  });

  it.each([
    ['delta-seconds', () => '30'],
    ['HTTP-date', () => new Date(Date.now() + 30_000).toUTCString()],
  ])('does not wait out a Retry-After (%s) that would end after the deadline', async (_form, retryAfter) => {
    stub.script((_req, res) => reply(res, 503, problem(503, 'down'), { 'retry-after': retryAfter() }));
    const deadline = monotonicNow() + 5_000;

    const result = await client().createCharge(chargeRequest(), outboundKey(), deadline, CLIENT);

    expect(monotonicNow()).toBeLessThan(deadline);
    expect(result.kind).toBe('unknown');
    expect(result.kind === 'unknown' && result.reason).toMatch(
      /^Retry-After of (29|30) s would end after the deadline; last of 1 attempt: HTTP 503$/,
    );
    expect(stub.requests).toHaveLength(1);
  });

  it('sends nothing when the deadline is closer than one attempt could take', async () => {
    stub.script(succeed);

    const result = await client({ timeoutMs: 2_000 }).createCharge(chargeRequest(), outboundKey(), monotonicNow() + 500, CLIENT);

    expect(result).toEqual({ kind: 'unknown', reason: 'the deadline leaves no time for an attempt' });
    expect(stub.requests).toHaveLength(0);
  });

  it('starts no attempt that could end after the deadline', async () => {
    stub.script(hang);
    const psp = client({ timeoutMs: 150, maxAttempts: 10 });

    // Each attempt takes at least 150 ms here, so at most 2 can start and end within 400 ms.
    const result = await psp.createCharge(chargeRequest(), outboundKey(), monotonicNow() + 400, CLIENT);

    expect(result.kind).toBe('unknown');
    expect(result.kind === 'unknown' && result.reason).toMatch(
      /^the deadline leaves no time for another attempt; last of [12] attempts?: timeout/,
    );
    const attempts = await metricValue('psp_attempts_total', { operation: 'charge', result: 'timeout' });
    expect(attempts).toBeGreaterThanOrEqual(1);
    expect(attempts).toBeLessThanOrEqual(2);
  });

  it('refuses an outbound key that cannot be a header before sending anything', async () => {
    stub.script(succeed);

    await expect(client().createCharge(chargeRequest(), 'two words', farDeadline(), CLIENT)).rejects.toThrow(TypeError);
    await expect(client().createCharge(chargeRequest(), '', farDeadline(), CLIENT)).rejects.toThrow(TypeError);
    expect(stub.requests).toHaveLength(0);
  });
});

describe('PspClient circuit breakers', () => {
  it('opens after breakerThreshold calls with unknown outcomes, then answers breaker-open without calling', async () => {
    stub.script((_req, res) => reply(res, 503, problem(503, 'down')));
    const psp = client({ maxAttempts: 2, breakerThreshold: 3 });

    for (let i = 0; i < 3; i++)
      expect((await psp.createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT)).kind).toBe('unknown');
    expect(stub.requests).toHaveLength(6); // one breaker sample per call, not per attempt

    const check = psp.chargeBreakerOpen(CARD);
    expect(check.open).toBe(true);
    expect(check.open && check.retryAfterSeconds).toBeGreaterThanOrEqual(55);
    const result = await psp.createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT);
    expect(result.kind).toBe('breaker-open');
    expect(result.kind === 'breaker-open' && result.retryAfterSeconds).toBeGreaterThanOrEqual(55);
    // Refunds share the charges breaker.
    const refund = await psp.createRefund(
      { chargeId: 'ch_1', amountMinor: 1, metadata: { refundId: randomUUID(), paymentId: randomUUID() } },
      outboundKey(),
      farDeadline(),
      CARD,
    );
    expect(refund.kind).toBe('breaker-open');
    expect(stub.requests).toHaveLength(6);
    expect(await metricValue('psp_breaker_state', { breaker: 'charges' })).toBe(2);
    expect(await metricValue('psp_calls_total', { operation: 'charge', outcome: 'breaker-open' })).toBe(1);

    // Lookups have their own breaker: still asked.
    stub.script((_req, res) => reply(res, 200, { items: [] }));
    await expect(psp.findChargesByPayment(randomUUID(), anyCharge)).resolves.toEqual([]);
    expect(stub.requests).toHaveLength(1);
    expect(await metricValue('psp_breaker_state', { breaker: 'lookups' })).toBe(0);
  });

  it("counts a call carrying one of the sandbox's fault tokens against its client's own breaker, never the shared one", async () => {
    stub.script((_req, res) => reply(res, 503, problem(503, 'down')));
    const psp = client({ maxAttempts: 1, breakerThreshold: 2 });
    for (let i = 0; i < 2; i++)
      expect((await psp.createCharge(chargeRequest('tok_unavailable'), outboundKey(), farDeadline(), CLIENT)).kind).toBe('unknown');

    // Alice's fault tokens are turned away now without a call: a charge, and a refund of a charge made with one.
    const lost = { clientId: CLIENT, source: 'tok_lost' };
    expect(psp.chargeBreakerOpen(lost).open).toBe(true);
    expect((await psp.createCharge(chargeRequest('tok_lost'), outboundKey(), farDeadline(), CLIENT)).kind).toBe('breaker-open');
    expect((await psp.createRefund(refundRequest(), outboundKey(), farDeadline(), lost)).kind).toBe('breaker-open');
    expect(stub.requests).toHaveLength(2);
    expect(logs.entries).toContainEqual(
      expect.objectContaining({ level: 'warn', fields: expect.objectContaining({ breaker: 'charges', clientId: CLIENT, state: 'open' }) }),
    );

    // The shared breaker counted none of it: Alice's card and another client's fault token still go out.
    expect(psp.chargeBreakerOpen(CARD).open).toBe(false);
    expect(psp.chargeBreakerOpen({ clientId: 'bob', source: 'tok_unavailable' }).open).toBe(false);
    expect(await metricValue('psp_breaker_state', { breaker: 'charges' })).toBe(0);
    stub.script(succeed);
    expect((await psp.createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT)).kind).toBe('succeeded');
    expect((await psp.createCharge(chargeRequest('tok_slow'), outboundKey(), farDeadline(), 'bob')).kind).toBe('succeeded');
    expect(stub.requests).toHaveLength(2);
  });

  it('counts a failed call with any other source against the shared breaker, which then turns every client away', async () => {
    stub.script((_req, res) => reply(res, 503, problem(503, 'down')));
    const psp = client({ maxAttempts: 1, breakerThreshold: 2 });
    // tok_chargeDeclined simulates no fault: a real provider's failure on it is everybody's.
    expect((await psp.createCharge(chargeRequest('tok_chargeDeclined'), outboundKey(), farDeadline(), CLIENT)).kind).toBe('unknown');
    expect((await psp.createCharge(chargeRequest('card_4242'), outboundKey(), farDeadline(), 'bob')).kind).toBe('unknown');
    expect(psp.chargeBreakerOpen({ clientId: 'carol', source: 'tok_visa' }).open).toBe(true);
    expect((await psp.createCharge(chargeRequest(), outboundKey(), farDeadline(), 'carol')).kind).toBe('breaker-open');
    expect(stub.requests).toHaveLength(2);
  });

  it('counts declines and refusals as answers, not failures', async () => {
    const outcomes = [503, 402, 503, 422, 503, 503];
    stub.script((req, res, n) => {
      const status = outcomes[n - 1];
      if (status === 402) reply(res, 402, chargeRecord(lastBody(req), 'failed'));
      else reply(res, status, problem(status, 'no'));
    });
    const psp = client({ maxAttempts: 1, breakerThreshold: 2 });

    const kinds = [];
    for (let i = 0; i < 5; i++) {
      kinds.push((await psp.createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT)).kind);
      expect(psp.chargeBreakerOpen(CARD).open).toBe(false);
    }
    expect(kinds).toEqual(['unknown', 'declined', 'unknown', 'refused', 'unknown']);

    // The second unknown outcome in a row opens it.
    expect((await psp.createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT)).kind).toBe('unknown');
    expect(psp.chargeBreakerOpen(CARD).open).toBe(true);
  });

  it('lets one probe through after breakerHalfOpenMs, turns others away meanwhile, and closes when it succeeds', async () => {
    const psp = client({ maxAttempts: 1, breakerThreshold: 1, breakerHalfOpenMs: 200 });
    stub.script((_req, res) => reply(res, 503, problem(503, 'down')));
    expect((await psp.createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT)).kind).toBe('unknown');
    expect(psp.chargeBreakerOpen(CARD).open).toBe(true);

    await waitFor(() => !psp.chargeBreakerOpen(CARD).open);
    expect(psp.chargeBreakerOpen(CARD).open).toBe(false);
    expect(await metricValue('psp_breaker_state', { breaker: 'charges' })).toBe(1);

    let release: (() => void) | undefined;
    stub.script((req, res, n) => {
      release = () => succeed(req, res, n);
    });
    const probe = psp.createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT);
    await waitFor(() => release !== undefined);
    expect(stub.requests).toHaveLength(1);

    // While the probe is out, nobody else gets through.
    expect(psp.chargeBreakerOpen(CARD)).toEqual({ open: true, retryAfterSeconds: 1 });
    expect((await psp.createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT)).kind).toBe('breaker-open');
    expect(stub.requests).toHaveLength(1);

    release!();
    expect((await probe).kind).toBe('succeeded');
    expect(psp.chargeBreakerOpen(CARD)).toEqual({ open: false });
    expect(await metricValue('psp_breaker_state', { breaker: 'charges' })).toBe(0);
  });

  it('opens again when the probe fails', async () => {
    const psp = client({ maxAttempts: 1, breakerThreshold: 1, breakerHalfOpenMs: 200 });
    stub.script((_req, res) => reply(res, 503, problem(503, 'down')));
    await psp.createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT);
    await waitFor(() => !psp.chargeBreakerOpen(CARD).open);
    expect(psp.chargeBreakerOpen(CARD).open).toBe(false);

    expect((await psp.createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT)).kind).toBe('unknown');

    expect(psp.chargeBreakerOpen(CARD).open).toBe(true);
    expect(stub.requests).toHaveLength(2);
  });

  it('stops retrying a call when other calls open the breaker meanwhile', async () => {
    // The slow call waits out Retry-After: 2; meanwhile another call fails and opens the breaker.
    stub.script((_req, res, n) => reply(res, 503, problem(503, 'down'), n === 1 ? { 'retry-after': '2' } : {}));
    const psp = client({ maxAttempts: 2, breakerThreshold: 1 });

    const slow = psp.createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT);
    await waitFor(() => stub.requests.length === 1);
    expect((await psp.createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT)).kind).toBe('unknown');
    expect(psp.chargeBreakerOpen(CARD).open).toBe(true);
    const requestsBefore = stub.requests.length;

    expect(await slow).toEqual({ kind: 'unknown', reason: 'the charges breaker opened while retrying; last of 1 attempt: HTTP 503' });
    expect(stub.requests).toHaveLength(requestsBefore);
  });
});

describe('PspClient lookups', () => {
  it('returns [] for an empty 200 and the items otherwise', async () => {
    const paymentId = randomUUID();
    stub.script((_req, res) => reply(res, 200, { items: [] }));
    const psp = client();

    await expect(psp.findChargesByPayment(paymentId, anyCharge)).resolves.toEqual([]);
    expect(stub.requests.map((r) => [r.method, r.url, r.headers['idempotency-key']])).toEqual([
      ['GET', `/psp/charges?paymentId=${paymentId}`, undefined],
    ]);

    // Records that match what we expect are returned, all of them.
    const charges = [chargeItem(paymentId), chargeItem(paymentId, (c) => ({ ...c, status: 'failed', failureCode: 'card_declined' }))];
    stub.script((_req, res) => reply(res, 200, { items: charges }));
    await expect(psp.findChargesByPayment(paymentId, { amountMinor: 1250, currency: 'EUR' })).resolves.toEqual(charges);

    const refundId = randomUUID();
    const refund = {
      id: 're_1',
      status: 'succeeded',
      chargeId: 'ch_1',
      amountMinor: 5,
      failureCode: null,
      metadata: { refundId, paymentId },
      createdAt: new Date().toISOString(),
    };
    stub.script((_req, res) => reply(res, 200, { items: [refund] }));
    await expect(psp.findRefundsByRefund(refundId, { paymentId, amountMinor: 5 })).resolves.toEqual([refund]);
    expect(stub.requests[0].url).toBe(`/psp/refunds?refundId=${refundId}`);
    expect(alerts()).toEqual([]);
    expect(await metricValue('psp_calls_total', { operation: 'lookup-charges', outcome: 'ok' })).toBe(2);
    expect(await metricValue('psp_calls_total', { operation: 'lookup-refunds', outcome: 'ok' })).toBe(1);
  });

  it('encodes the id into the query', async () => {
    stub.script((_req, res) => reply(res, 200, { items: [] }));

    await client().findChargesByPayment('a&b=c', anyCharge);

    expect(stub.requests[0].url).toBe('/psp/charges?paymentId=a%26b%3Dc');
  });

  it("lists a page of charges on the lookups' path; a page with an item that is not a charge, or without hasMore, is unknown", async () => {
    const page = [chargeItem(randomUUID()), chargeItem(randomUUID())];
    const answers = [{ items: page, hasMore: true }, { items: [page[0], { id: 'ch_1' }], hasMore: false }, { items: page }];
    stub.script((_req, res, n) => reply(res, 200, answers[n - 1]));
    const psp = client();
    const createdAfter = new Date('2026-11-30T12:00:00.000Z');

    expect(await psp.listCharges({ createdAfter, startingAfter: 'ch_5f0c3e2a1b9d8c7e6f5a4b3c', limit: 2 }, farDeadline())).toEqual({
      kind: 'succeeded',
      value: { items: page, hasMore: true },
    });
    expect(stub.requests.map((r) => [r.method, r.url])).toEqual([
      ['GET', '/psp/charges?createdAfter=2026-11-30T12%3A00%3A00.000Z&startingAfter=ch_5f0c3e2a1b9d8c7e6f5a4b3c&limit=2'],
    ]);
    for (let i = 0; i < 2; i++)
      expect(await psp.listCharges({ createdAfter }, farDeadline())).toEqual({ kind: 'unknown', reason: 'HTTP 200 after 1 attempt' });
    expect(stub.requests[1].url).toBe('/psp/charges?createdAfter=2026-11-30T12%3A00%3A00.000Z');
    expect(await metricValue('psp_calls_total', { operation: 'list-charges', outcome: 'ok' })).toBe(1);
    expect(await metricValue('psp_calls_total', { operation: 'list-charges', outcome: 'unreachable' })).toBe(2);
  });

  it('throws PspUnreachableError after every attempt got a 5xx', async () => {
    stub.script((_req, res) => reply(res, 503, problem(503, 'down')));

    await expect(client({ maxAttempts: 3 }).findChargesByPayment(randomUUID(), anyCharge)).rejects.toThrow(PspUnreachableError);
    expect(stub.requests).toHaveLength(3);
    expect(await metricValue('psp_calls_total', { operation: 'lookup-charges', outcome: 'unreachable' })).toBe(1);
  });

  it('throws PspUnreachableError when every attempt times out', async () => {
    stub.script(hang);

    const error = await client({ timeoutMs: 150, maxAttempts: 2 })
      .findRefundsByRefund(randomUUID(), anyRefund())
      .catch((e: unknown) => e);

    expect(error).toBeInstanceOf(PspUnreachableError);
    expect((error as PspUnreachableError).reason).toBe('timeout: no complete answer within 150 ms after 2 attempts');
  });

  it('throws PspUnreachableError for a 200 it cannot read, rather than answer "none"', async () => {
    stub.script((_req, res) => reply(res, 200, { items: [{ id: 'ch_1' }] }));

    await expect(client().findChargesByPayment(randomUUID(), anyCharge)).rejects.toThrow(PspUnreachableError);
  });

  it('stops reading a lookup answer at MAX_RESPONSE_BYTES and throws PspUnreachableError, after every attempt', async () => {
    stub.script((_req, res) => streamEndlessly(res, 200, 4 * MAX_RESPONSE_BYTES));

    const error = await client({ maxAttempts: 2 })
      .findChargesByPayment(randomUUID(), anyCharge)
      .catch((e: unknown) => e);

    expect(error).toBeInstanceOf(PspUnreachableError);
    expect((error as PspUnreachableError).reason).toBe(`network: the answer's body is over ${MAX_RESPONSE_BYTES} bytes after 2 attempts`);
    expect(stub.requests).toHaveLength(2);
    expect(await metricValue('psp_calls_total', { operation: 'lookup-charges', outcome: 'unreachable' })).toBe(1);
  });

  it.each([400, 404, 422])(
    'throws PspUnreachableError for a lookup refused with %i, never [], with an alert and without retrying',
    async (status) => {
      // Even with a body that reads as an empty list: a refusal is no answer.
      stub.script((_req, res) => reply(res, status, { ...problem(status, 'no'), items: [] }));
      const paymentId = randomUUID();

      const error = await client()
        .findChargesByPayment(paymentId, anyCharge)
        .catch((e: unknown) => e);

      expect(error).toBeInstanceOf(PspUnreachableError);
      expect((error as PspUnreachableError).reason).toBe(`the provider refused the lookup (HTTP ${status})`);
      expect(stub.requests).toHaveLength(1);
      expect(alerts()).toEqual([
        expect.objectContaining({
          fields: expect.objectContaining({ operation: 'lookup-charges', query: { paymentId }, status, alert: true }),
        }),
      ]);
      expect(await metricValue('psp_calls_total', { operation: 'lookup-charges', outcome: 'refused' })).toBe(1);
      expect(await metricValue('psp_calls_total', { operation: 'lookup-charges', outcome: 'ok' })).toBe(0);
    },
  );

  it('throws PspUnreachableError for a refused refund lookup as well', async () => {
    stub.script((_req, res) => reply(res, 404, problem(404, 'no such route')));

    await expect(client().findRefundsByRefund(randomUUID(), anyRefund())).rejects.toThrow(PspUnreachableError);
    expect(stub.requests).toHaveLength(1);
    expect(alerts()).toHaveLength(1);
    expect(await metricValue('psp_calls_total', { operation: 'lookup-refunds', outcome: 'refused' })).toBe(1);
  });

  it.each<[string, (paymentId: string) => unknown[], string]>([
    ['another metadata.paymentId', () => [chargeItem('pay_other')], 'metadata.paymentId pay_other ≠ ours '],
    ['another amountMinor', (id) => [chargeItem(id, (c) => ({ ...c, amountMinor: 1200 }))], 'amountMinor 1200 ≠ ours 1250'],
    ['another currency', (id) => [chargeItem(id, (c) => ({ ...c, currency: 'GBP' }))], 'currency GBP ≠ ours EUR'],
    [
      'a second item with another amountMinor',
      (id) => [chargeItem(id), chargeItem(id, (c) => ({ ...c, amountMinor: 1 }))],
      'amountMinor 1 ≠ ours 1250',
    ],
  ])('throws PspUnreachableError for a charge lookup answered with %s, with an alert', async (_case, items, disagreement) => {
    const paymentId = randomUUID();
    stub.script((_req, res) => reply(res, 200, { items: items(paymentId) }));

    const error = await client()
      .findChargesByPayment(paymentId, { amountMinor: 1250, currency: 'EUR' })
      .catch((e: unknown) => e);

    expect(error).toBeInstanceOf(PspUnreachableError);
    expect((error as PspUnreachableError).reason.startsWith(`the answer does not match: ${disagreement}`)).toBe(true);
    expect(stub.requests).toHaveLength(1);
    expect(alerts()).toEqual([
      expect.objectContaining({ fields: expect.objectContaining({ operation: 'lookup-charges', query: { paymentId }, alert: true }) }),
    ]);
    expect(await metricValue('psp_calls_total', { operation: 'lookup-charges', outcome: 'unknown' })).toBe(1);
    expect(await metricValue('psp_calls_total', { operation: 'lookup-charges', outcome: 'ok' })).toBe(0);
  });

  it.each<[string, (r: Record<string, unknown> & { metadata: Record<string, string> }) => unknown, string]>([
    [
      'another metadata.paymentId',
      (r) => ({ ...r, metadata: { ...r.metadata, paymentId: 'pay_other' } }),
      'metadata.paymentId pay_other ≠ ours ',
    ],
    ['another amountMinor', (r) => ({ ...r, amountMinor: 4 }), 'amountMinor 4 ≠ ours 5'],
    [
      'another metadata.refundId',
      (r) => ({ ...r, metadata: { ...r.metadata, refundId: 'ref_other' } }),
      'metadata.refundId ref_other ≠ ours ',
    ],
  ])('throws PspUnreachableError for a refund lookup answered with %s, with an alert', async (_case, alter, disagreement) => {
    const [refundId, paymentId] = [randomUUID(), randomUUID()];
    const refund = {
      id: 're_1',
      status: 'succeeded',
      chargeId: 'ch_1',
      amountMinor: 5,
      failureCode: null,
      metadata: { refundId, paymentId },
      createdAt: new Date().toISOString(),
    };
    stub.script((_req, res) => reply(res, 200, { items: [alter(refund)] }));

    const error = await client()
      .findRefundsByRefund(refundId, { paymentId, amountMinor: 5 })
      .catch((e: unknown) => e);

    expect(error).toBeInstanceOf(PspUnreachableError);
    expect((error as PspUnreachableError).reason.startsWith(`the answer does not match: ${disagreement}`)).toBe(true);
    expect(stub.requests).toHaveLength(1);
    expect(alerts()).toEqual([expect.objectContaining({ fields: expect.objectContaining({ operation: 'lookup-refunds', alert: true }) })]);
    expect(await metricValue('psp_calls_total', { operation: 'lookup-refunds', outcome: 'unknown' })).toBe(1);
  });

  it('has its own breaker: once open, lookups throw without calling, and charges still go out', async () => {
    stub.script((_req, res) => reply(res, 500, problem(500, 'down')));
    const psp = client({ maxAttempts: 1, breakerThreshold: 2 });
    for (let i = 0; i < 2; i++) await expect(psp.findChargesByPayment(randomUUID(), anyCharge)).rejects.toThrow(PspUnreachableError);
    expect(stub.requests).toHaveLength(2);

    const error = await psp.findRefundsByRefund(randomUUID(), anyRefund()).catch((e: unknown) => e);
    expect((error as PspUnreachableError).reason).toMatch(/^lookups breaker open/);
    expect(stub.requests).toHaveLength(2);

    stub.script(succeed);
    expect((await psp.createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT)).kind).toBe('succeeded');
    expect(stub.requests).toHaveLength(1);
  });
});

describe('PspClientModule, metrics and logs', () => {
  @Module({
    imports: [
      MetricsModule,
      PspClientModule.forRootAsync({
        useFactory: () => ({
          baseUrl: () => stub.baseUrl,
          apiKey: PROVIDER_KEY,
          timeoutMs: 2_000,
          maxAttempts: 3,
          breakerThreshold: 5,
          breakerHalfOpenMs: 10_000,
          backoffInitialMs: 5,
          backoffMaxMs: 20,
        }),
      }),
    ],
  })
  class TestModule {}

  let app: INestApplicationContext | undefined;

  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  it('provides one PspClient whose attempts, outcomes and breaker states show in the app registry and the log', async () => {
    app = await NestFactory.createApplicationContext(TestModule, { logger: logs });
    const psp = app.get(PspClient);
    registry = app.get(Registry);
    stub.script((req, res, n) => (n === 1 ? reply(res, 503, problem(503, 'down')) : succeed(req, res, n)));
    const key = outboundKey();

    expect((await psp.createCharge(chargeRequest(), key, farDeadline(), CLIENT)).kind).toBe('succeeded');

    const text = await registry.metrics();
    expect(text).toContain('psp_attempts_total{operation="charge",result="503"} 1');
    expect(text).toContain('psp_attempts_total{operation="charge",result="201"} 1');
    expect(text).toContain('psp_calls_total{operation="charge",outcome="succeeded"} 1');
    expect(text).toContain('psp_breaker_state{breaker="charges"} 0');
    expect(text).toContain('psp_breaker_state{breaker="lookups"} 0');
    expect(logs.entries).toContainEqual({
      level: 'warn',
      fields: expect.objectContaining({ operation: 'charge', attempt: 1, status: 503, outboundKey: key }),
      message: 'psp attempt without a definite answer',
    });
    expect(logs.entries).toContainEqual(
      expect.objectContaining({ fields: expect.objectContaining({ operation: 'charge', attempt: 2, status: 201, outboundKey: key }) }),
    );
    expect(logs.entries).toContainEqual(
      expect.objectContaining({ fields: expect.objectContaining({ operation: 'charge', outboundKey: key, outcome: 'succeeded' }) }),
    );
  });

  it('logs the breaker opening', async () => {
    stub.script((_req, res) => reply(res, 503, problem(503, 'down')));
    const psp = client({ maxAttempts: 1, breakerThreshold: 1 });

    await psp.createCharge(chargeRequest(), outboundKey(), farDeadline(), CLIENT);

    expect(logs.entries).toContainEqual(
      expect.objectContaining({ level: 'warn', fields: expect.objectContaining({ breaker: 'charges', state: 'open' }) }),
    );
  });
});
