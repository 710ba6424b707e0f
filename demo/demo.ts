/**
 * npm run demo — a narrated walk through every pattern, over HTTP, as a client sees it.
 *
 * Each step prints the request (method, path, the headers that matter, body), the response (status,
 * the headers that matter, body), one line on what it shows and the docs/patterns page that explains
 * it. Every answer is checked against what the narration says: the first one that differs stops the
 * walk with exit code 1, so the demo doubles as a smoke test of a running service.
 *
 * DEMO_URL=http://localhost:3000 walks a running service (DEMO_API_KEY, default the dev key; the
 * webhook step needs DEMO_WEBHOOK_SECRET, else it is skipped). Without DEMO_URL the built service
 * (dist/src/main.js) is started with `npm start`'s settings on an embedded PostgreSQL in a temp folder, and
 * stopped at the end, also on an error or Ctrl-C. Colour when stdout is a terminal and NO_COLOR is unset.
 * No step waits on a clock for its outcome: a duplicate is sent once the first request is seen in flight.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createHash, randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { Webhook } from 'standardwebhooks';
import { DEV_API_CLIENT, DEV_WEBHOOK_SECRET } from '../src/config/app-config.js';
import { freePort } from '../src/common/free-port.js';

/** One request's bound: a slow machine is fine, a hung service is a failed demo rather than a hung one. */
const REQUEST_TIMEOUT_MS = 60_000;
/** How long the embedded service may take to start (PostgreSQL's initdb on first use is the slow part). */
const START_TIMEOUT_MS = 120_000;
/** The 503 payment-pending says when to retry; the demo honours it, up to this, so it never stalls. */
const MAX_RETRY_AFTER_MS = 5_000;
/** The headers worth showing: the ones the patterns are about. */
const SHOWN_HEADERS = ['location', 'etag', 'idempotent-replayed', 'retry-after', 'content-type'];

const MAIN = resolve(dirname(fileURLToPath(import.meta.url)), '../src/main.js');

// ---------- output ----------

const useColour = process.stdout.isTTY === true && !('NO_COLOR' in process.env && process.env.NO_COLOR !== '');
const paint = (code: string) => (text: string) => (useColour ? `\x1b[${code}m${text}\x1b[0m` : text);
const bold = paint('1');
const dim = paint('2');
const green = paint('32');
const red = paint('31');
const yellow = paint('33');
const cyan = paint('36');
const magenta = paint('35');

const out = (line = '') => process.stdout.write(`${line}\n`);
const truncate = (text: string, max = 600) => (text.length > max ? `${text.slice(0, max)}… (${text.length} bytes)` : text);

/** A step whose answer is not what the narration says. */
class DemoMismatch extends Error {}

function check(condition: boolean, what: string): asserts condition {
  if (!condition) throw new DemoMismatch(what);
}

// ---------- HTTP ----------

interface Req {
  method: 'GET' | 'POST' | 'PATCH';
  path: string;
  headers?: Record<string, string>;
  body?: unknown;
  /** Print nothing (a request fired in bulk, summarised by the step). */
  quiet?: boolean;
}

interface Res {
  status: number;
  headers: Headers;
  text: string;
  /** The members the demo reads ({} when the body is not a JSON object). */
  json: Body;
}

interface Body {
  id?: string;
  type?: string;
  status?: string;
  token?: string;
  orderId?: string;
  paymentId?: string;
  outcome?: string;
  amountMinor?: number;
  currency?: string;
  providerTransactionId?: string;
}

let baseUrl = '';
let apiKey = '';

async function call(req: Req): Promise<Res> {
  const raw = req.body === undefined ? undefined : typeof req.body === 'string' ? req.body : JSON.stringify(req.body);
  const headers: Record<string, string> = { authorization: `Bearer ${apiKey}`, ...req.headers };
  if (raw !== undefined) headers['content-type'] ??= 'application/json';
  if (!req.quiet) {
    out(`  ${cyan('→')} ${bold(`${req.method} ${req.path}`)}`);
    for (const [name, value] of Object.entries(req.headers ?? {})) if (name !== 'content-type') out(`    ${dim(`${name}:`)} ${value}`);
    if (raw !== undefined) out(`    ${truncate(raw)}`);
  }
  const res = await fetch(`${baseUrl}${req.path}`, {
    method: req.method,
    headers,
    body: raw,
    signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
  });
  const text = await res.text();
  let json: Body = {};
  try {
    const parsed: unknown = text ? JSON.parse(text) : undefined;
    if (parsed && typeof parsed === 'object') json = parsed;
  } catch {
    // not JSON: the text is shown as it is
  }
  const answer: Res = { status: res.status, headers: res.headers, text, json };
  if (!req.quiet) printResponse(answer);
  return answer;
}

function printResponse(res: Res): void {
  const colour = res.status < 300 ? green : res.status < 500 ? yellow : red;
  out(`  ${colour('←')} ${colour(bold(String(res.status)))}`);
  for (const name of SHOWN_HEADERS) {
    const value = res.headers.get(name);
    if (value !== null) out(`    ${dim(`${name}:`)} ${name === 'idempotent-replayed' ? magenta(value) : value}`);
  }
  if (res.text) out(`    ${truncate(res.text)}`);
}

// ---------- narration ----------

let stepNo = 0;
const stepsRun: string[] = [];

async function step(title: string, body: () => Promise<void>): Promise<void> {
  stepNo++;
  out();
  out(bold(`${stepNo}. ${title}`));
  await body();
  stepsRun.push(title);
}

/** The one line on what the step shows, and where to read more. */
function shows(text: string, page: string): void {
  out(`  ${green('✓')} ${dim(text)}`);
  out(`    ${dim(`→ docs/patterns/${page}`)}`);
}

const note = (text: string) => out(`  ${dim(text)}`);
const sha = (text: string) => createHash('sha256').update(text).digest('hex').slice(0, 12);

/** How often, and for how long at most, the demo asks whether a request it sent is in flight yet. */
const IN_FLIGHT_POLL_MS = 20;
const IN_FLIGHT_DEADLINE_MS = 30_000;

/**
 * Asks GET `orderPayments` until a pending payment shows: the request in `sent` has claimed its key and recorded its
 * payment, and is now at the provider. A mismatch when `sent` answers first (nothing was seen in flight) or never shows.
 */
async function untilInFlight(orderPayments: string, sent: Promise<Res>): Promise<{ answer: Res; paymentId: string }> {
  let answered = false;
  void sent.then(
    () => (answered = true),
    () => (answered = true),
  );
  const deadline = Date.now() + IN_FLIGHT_DEADLINE_MS;
  for (;;) {
    const answer = await call({ method: 'GET', path: orderPayments, quiet: true });
    const items = (JSON.parse(answer.text || '{}') as { items?: { id: string; status: string }[] }).items ?? [];
    const pending = items.find((p) => p.status === 'pending');
    if (pending) return { answer, paymentId: pending.id };
    check(!answered, 'expected the first request to be seen in flight, but it answered first');
    check(Date.now() < deadline, `expected a pending payment within ${IN_FLIGHT_DEADLINE_MS / 1000} s`);
    await sleep(IN_FLIGHT_POLL_MS);
  }
}

// ---------- the walk ----------

async function walk(webhookSecret: string | undefined, whyNoWebhook: string): Promise<void> {
  // Order numbers unique to this run: a running service keeps its data between demos.
  const run = Date.now().toString(36);
  const key = (name: string) => `demo-${run}-${name}`;
  const orderBody = (n: string, quantity = 2) => ({
    orderNumber: `DEMO-${run}-${n}`,
    currency: 'EUR',
    items: [{ sku: 'SKU-1', quantity, unitPriceMinor: 1999 }],
  });

  let first!: Res;
  let orderId = '';
  await step('Create an order with an Idempotency-Key', async () => {
    first = await call({ method: 'POST', path: '/orders', headers: { 'Idempotency-Key': key('create') }, body: orderBody('1') });
    check(first.status === 201, `expected 201, got ${first.status}`);
    orderId = first.json.id ?? '';
    shows('the claim on the key, the order and the recorded answer commit in one transaction.', 'idempotency-key.md');
  });

  await step('Retry it with the same key and body', async () => {
    const again = await call({ method: 'POST', path: '/orders', headers: { 'Idempotency-Key': key('create') }, body: orderBody('1') });
    check(again.status === 201, `expected 201, got ${again.status}`);
    check(again.headers.get('idempotent-replayed') === 'true', 'expected Idempotent-Replayed: true');
    check(again.text === first.text, 'expected the same body bytes as the first answer');
    shows(`a replay: the first answer byte for byte (sha256 ${sha(again.text)} both times), nothing ran again.`, 'idempotency-key.md');
  });

  await step('Same key, another body', async () => {
    const reused = await call({ method: 'POST', path: '/orders', headers: { 'Idempotency-Key': key('create') }, body: orderBody('1', 3) });
    check(reused.status === 422, `expected 422, got ${reused.status}`);
    check(reused.json.type === 'urn:idempotent-orders:problem:idempotency-key-reused', 'expected problem type idempotency-key-reused');
    shows(
      'the key is fingerprinted with method, path and canonical JSON: reused for another request → 422, nothing runs.',
      'idempotency-key.md',
    );
  });

  let stormOrderId = '';
  await step('20 identical requests at once, one key', async () => {
    const req: Req = { method: 'POST', path: '/orders', headers: { 'Idempotency-Key': key('storm') }, body: orderBody('storm') };
    out(`  ${cyan('→')} ${bold('20 × POST /orders')} ${dim('(in parallel)')}`);
    out(`    ${dim('idempotency-key:')} ${key('storm')}`);
    out(`    ${JSON.stringify(req.body)}`);
    const answers = await Promise.all(Array.from({ length: 20 }, () => call({ ...req, quiet: true })));
    const statuses = answers.map((a) => a.status);
    const replayed = answers.filter((a) => a.headers.get('idempotent-replayed') === 'true').length;
    const ids = new Set(answers.filter((a) => a.status === 201).map((a) => a.json.id ?? ''));
    out(`  ${green('←')} ${bold(statuses.join(' '))}`);
    out(`    ${ids.size} order id: ${[...ids].join(', ')}; ${replayed} answers marked idempotent-replayed: true`);
    check(
      statuses.every((s) => s === 201),
      `expected 20 × 201, got ${statuses.join(' ')}`,
    );
    check(ids.size === 1, `expected one order, got ${ids.size}`);
    check(replayed === 19, `expected 19 replays, got ${replayed}`);
    stormOrderId = [...ids][0];
    shows(
      'the duplicates waited for the first request (row lock, in-memory queue) and replayed it: one order, no 409.',
      'concurrent-duplicates.md',
    );
  });

  await step('The same order number again, under a new key', async () => {
    const repeat = await call({
      method: 'POST',
      path: '/orders',
      headers: { 'Idempotency-Key': key('create-again') },
      body: orderBody('1'),
    });
    check(repeat.status === 200, `expected 200, got ${repeat.status}`);
    check(repeat.json.id === orderId, `expected the order of step 1 (${orderId}), got ${repeat.json.id}`);
    shows(
      'UNIQUE (client_id, order_number) + ON CONFLICT: a client that lost its key still gets its one order (200, not 201).',
      'natural-key.md',
    );
  });

  await step('Edit with If-Match, then again with the stale ETag', async () => {
    const read = await call({ method: 'GET', path: `/orders/${orderId}` });
    const etag = read.headers.get('etag');
    check(read.status === 200 && etag !== null, 'expected 200 with an ETag');
    const edit = await call({
      method: 'PATCH',
      path: `/orders/${orderId}`,
      headers: { 'If-Match': etag },
      body: { note: 'leave at the door' },
    });
    check(edit.status === 200, `expected 200, got ${edit.status}`);
    check(edit.headers.get('etag') !== etag, 'expected a new ETag');
    const stale = await call({ method: 'PATCH', path: `/orders/${orderId}`, headers: { 'If-Match': etag }, body: { note: 'ring twice' } });
    check(stale.status === 412, `expected 412, got ${stale.status}`);
    shows('UPDATE … AND version = $v: the second editor read an old version, so 412 instead of a lost update.', 'optimistic-locking.md');
  });

  await step('Cancel an order twice', async () => {
    const a = await call({ method: 'POST', path: `/orders/${stormOrderId}/cancel` });
    const b = await call({ method: 'POST', path: `/orders/${stormOrderId}/cancel` });
    check(a.status === 200 && b.status === 200, `expected 200 twice, got ${a.status} ${b.status}`);
    const events = await call({ method: 'GET', path: `/orders/${stormOrderId}/events` });
    const cancels = (JSON.parse(events.text) as { toStatus: string }[]).filter((e) => e.toStatus === 'cancelled').length;
    check(cancels === 1, `expected one history row to cancelled, got ${cancels}`);
    shows('one conditional UPDATE … WHERE status = ANY($allowed) with its history row: the repeat writes nothing.', 'state-machine.md');
  });

  let tokenOrderId = '';
  await step('A form submitted twice with one submit token', async () => {
    const token = await call({ method: 'POST', path: '/submit-tokens' });
    check(token.status === 201 && typeof token.json.token === 'string', `expected 201 with a token, got ${token.status}`);
    const form = {
      method: 'POST' as const,
      path: '/orders',
      headers: { 'Submit-Token': token.json.token },
      body: { currency: 'EUR', items: [{ sku: 'SKU-2', quantity: 1, unitPriceMinor: 2500 }] },
    };
    const a = await call(form);
    check(a.status === 201, `expected 201, got ${a.status}`);
    tokenOrderId = a.json.id ?? '';
    const b = await call(form);
    check(b.status === 409 && b.json.orderId === tokenOrderId, `expected 409 naming ${tokenOrderId}, got ${b.status}`);
    shows('the token is consumed in the order’s transaction: one order however often the button is pressed.', 'submit-tokens.md');
  });

  let payment!: Res;
  await step('Pay with tok_visa, then retry the payment', async () => {
    const pay = {
      method: 'POST' as const,
      path: `/orders/${orderId}/payments`,
      headers: { 'Idempotency-Key': key('pay') },
      body: { source: 'tok_visa' },
    };
    payment = await call(pay);
    check(payment.status === 201 && payment.json.status === 'succeeded', `expected 201 succeeded, got ${payment.status}`);
    const again = await call(pay);
    check(
      again.status === 201 && again.headers.get('idempotent-replayed') === 'true' && again.text === payment.text,
      'expected the same 201 replayed',
    );
    shows(
      'record, call the provider with no transaction open, settle: the retry replays the answer and charges nothing.',
      'phased-external-calls.md',
    );
  });

  await step('A declined card, then a new key that pays', async () => {
    const declined = {
      method: 'POST' as const,
      path: `/orders/${tokenOrderId}/payments`,
      headers: { 'Idempotency-Key': key('declined') },
      body: { source: 'tok_chargeDeclined' },
    };
    const a = await call(declined);
    check(
      a.status === 402 && a.json.type === 'urn:idempotent-orders:problem:payment-declined',
      `expected 402 payment-declined, got ${a.status}`,
    );
    const b = await call(declined);
    check(b.status === 402 && b.headers.get('idempotent-replayed') === 'true', `expected the 402 replayed, got ${b.status}`);
    const c = await call({
      method: 'POST',
      path: `/orders/${tokenOrderId}/payments`,
      headers: { 'Idempotency-Key': key('declined-retry') },
      body: { source: 'tok_visa' },
    });
    check(c.status === 201, `expected 201, got ${c.status}`);
    shows(
      'a decline is a final answer, stored under its key (the retry replays the 402); paying again takes a new key.',
      'phased-external-calls.md',
    );
  });

  await step('A duplicate while the first request is still at the provider', async () => {
    const created = await call({
      method: 'POST',
      path: '/orders',
      headers: { 'Idempotency-Key': key('inflight-order') },
      body: orderBody('inflight', 1),
    });
    check(created.status === 201, `expected 201, got ${created.status}`);
    const orderPayments = `/orders/${created.json.id ?? ''}/payments`;
    const pay = {
      method: 'POST' as const,
      path: orderPayments,
      headers: { 'Idempotency-Key': key('inflight') },
      body: { source: 'tok_processing' },
    };
    note('tok_processing: the sandbox works on the charge for half the provider timeout before making it, so the pay stays in flight.');
    out(`  ${cyan('→')} ${bold(`POST ${pay.path}`)} ${dim('(its answer is awaited below)')}`);
    out(`    ${dim('idempotency-key:')} ${key('inflight')}`);
    out(`    ${JSON.stringify(pay.body)}`);
    const firstPay = call({ ...pay, quiet: true });
    // Not a sleep: the duplicate goes once the first is seen in flight (its key claimed, its payment recorded pending).
    const seen = await untilInFlight(orderPayments, firstPay);
    out(`  ${cyan('→')} ${bold(`GET ${orderPayments}`)} ${dim('(asked until the first request shows)')}`);
    printResponse(seen.answer);
    note('the payment is pending: the first request holds the key under its lease and is waiting on the provider.');
    const duplicate = await call(pay);
    check(
      duplicate.status === 409 &&
        duplicate.json.type === 'urn:idempotent-orders:problem:idempotency-key-in-use' &&
        Number(duplicate.headers.get('retry-after')) >= 1,
      `expected 409 idempotency-key-in-use with Retry-After, got ${duplicate.status} ${duplicate.json.type ?? ''}`,
    );
    note("the first request's answer:");
    const first = await firstPay;
    printResponse(first);
    check(
      first.status === 201 && first.json.status === 'succeeded' && first.json.id === seen.paymentId,
      `expected 201 succeeded for payment ${seen.paymentId}, got ${first.status}`,
    );
    note('the duplicate, retried now that the first has answered:');
    const retried = await call(pay);
    check(
      retried.status === 201 && retried.headers.get('idempotent-replayed') === 'true' && retried.text === first.text,
      `expected the first's 201 replayed, got ${retried.status}`,
    );
    shows(
      'a duplicate while the key is held under its lease gets 409 + Retry-After, never a second charge; its retry replays the answer.',
      'concurrent-duplicates.md',
    );
  });

  await step('A lost response: the provider charged, the answer never came', async () => {
    const created = await call({
      method: 'POST',
      path: '/orders',
      headers: { 'Idempotency-Key': key('lost-order') },
      body: orderBody('lost', 1),
    });
    check(created.status === 201, `expected 201, got ${created.status}`);
    const pay = {
      method: 'POST' as const,
      path: `/orders/${created.json.id ?? ''}/payments`,
      headers: { 'Idempotency-Key': key('lost') },
      body: { source: 'tok_lost' },
    };
    note('tok_lost: the sandbox charges but every answer is late; the service retries until its attempts run out (~11 s by default).');
    const pending = await call(pay);
    check(
      pending.status === 503 && pending.json.type === 'urn:idempotent-orders:problem:payment-pending',
      `expected 503 payment-pending, got ${pending.status}`,
    );
    const retryAfter = Math.min(MAX_RETRY_AFTER_MS, Number(pending.headers.get('retry-after') ?? 1) * 1000);
    note(`waiting Retry-After (${retryAfter / 1000} s), as a client would; where is the payment now?`);
    await sleep(retryAfter);
    // The provider's charge.succeeded webhook may have settled it already (it is sent when the charge is made, unless the
    // service runs without webhooks): the narration says which happened, and the retry's answer is the same either way.
    const meanwhile = await call({ method: 'GET', path: `/payments/${pending.json.paymentId ?? ''}` });
    const settledByWebhook = meanwhile.json.status === 'succeeded';
    note(
      settledByWebhook
        ? 'already succeeded: the charge.succeeded webhook settled it. Retrying with the same key:'
        : 'still pending. Retrying with the same key:',
    );
    const retried = await call(pay);
    check(
      retried.status === 201 && retried.json.id === pending.json.paymentId,
      `expected 201 with payment ${pending.json.paymentId ?? ''}, got ${retried.status}`,
    );
    shows(
      settledByWebhook
        ? "unknown outcome → 503, payment left pending; the provider's webhook settled it, and the retry answers with that payment: one charge."
        : 'unknown outcome → 503, payment left pending; the retry looks the charge up by our id and settles it: one charge.',
      settledByWebhook ? 'webhook-consumer.md' : 'reconciliation.md',
    );
  });

  await step('Cancel the paid order and refund it in two parts', async () => {
    const cancel = await call({ method: 'POST', path: `/orders/${orderId}/cancel` });
    check(cancel.status === 200 && cancel.json.status === 'cancelled', `expected 200 cancelled, got ${cancel.status}`);
    const paymentId = payment.json.id ?? '';
    const part = await call({
      method: 'POST',
      path: `/payments/${paymentId}/refunds`,
      headers: { 'Idempotency-Key': key('refund-1') },
      body: { amountMinor: 500 },
    });
    check(part.status === 201 && part.json.amountMinor === 500, `expected 201 refunding 500, got ${part.status}`);
    const rest = await call({
      method: 'POST',
      path: `/payments/${paymentId}/refunds`,
      headers: { 'Idempotency-Key': key('refund-rest') },
      body: {},
    });
    const left = (payment.json.amountMinor ?? 0) - 500;
    check(rest.status === 201 && rest.json.amountMinor === left, `expected 201 refunding the rest (${left}), got ${rest.status}`);
    const order = await call({ method: 'GET', path: `/orders/${orderId}` });
    check(order.json.status === 'refunded', `expected the order refunded, got ${order.json.status ?? '?'}`);
    shows(
      'each refund reserves its amount with one conditional UPDATE (never more than was paid); all of it → refunded.',
      'phased-external-calls.md',
    );
  });

  await step('A signed webhook delivered twice', async () => {
    if (!webhookSecret) {
      note(`skipped: ${whyNoWebhook}`);
      return;
    }
    const p = payment.json;
    // The provider's own event for the charge of step 9: real ids and amounts, so it matches what we hold.
    const event = {
      type: 'charge.succeeded',
      timestamp: new Date().toISOString(),
      data: {
        chargeId: p.providerTransactionId,
        paymentId: p.id,
        orderId: p.orderId,
        amountMinor: p.amountMinor,
        currency: p.currency,
        status: 'succeeded',
      },
    };
    const raw = JSON.stringify(event);
    const id = `msg_${randomUUID()}`;
    const at = new Date();
    const headers = {
      'webhook-id': id,
      'webhook-timestamp': String(Math.floor(at.getTime() / 1000)),
      'webhook-signature': new Webhook(webhookSecret).sign(id, at, raw),
    };
    const a = await call({ method: 'POST', path: '/webhooks/psp', headers, body: raw });
    check(a.status === 200 && a.json.outcome !== 'duplicate', `expected 200 processed, got ${a.status} ${a.json.outcome ?? ''}`);
    const b = await call({ method: 'POST', path: '/webhooks/psp', headers, body: raw });
    check(b.status === 200 && b.json.outcome === 'duplicate', `expected 200 duplicate, got ${b.status} ${b.json.outcome ?? ''}`);
    shows(
      'the webhook-id is recorded in the same transaction as the effect: the redelivery is a duplicate, ignored.',
      'webhook-consumer.md',
    );
  });
}

// ---------- the service ----------

interface Service {
  url: string;
  stop(): Promise<void>;
}

/** The built service on an embedded PostgreSQL in a temp folder; stop() ends it and removes the folder. */
async function startService(): Promise<Service> {
  const dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-npm-demo-'));
  let child: ChildProcess | undefined;
  let output = '';
  const stop = async () => {
    if (child && child.exitCode === null && child.signalCode === null) {
      const exited = once(child, 'exit');
      child.kill('SIGTERM');
      const gone = await Promise.race([exited.then(() => true), sleep(30_000).then(() => false)]);
      if (!gone) {
        child.kill('SIGKILL');
        await exited;
      }
    }
    await rm(dir, { recursive: true, force: true });
  };
  try {
    // Run as root, the embedded server runs as "postgres", which must be able to traverse to its data folder.
    await chmod(dir, 0o711);
    const env: Record<string, string> = {
      PATH: process.env.PATH ?? '',
      PORT: '0',
      EMBEDDED_PG_DIR: join(dir, 'postgres'),
      EMBEDDED_PG_PORT: String(await freePort()),
      LOG_LEVEL: 'warn',
      // Nothing else: the service as `npm start` runs it (its provider timeouts, its lease, the sandbox's webhooks).
    };
    // cwd = the temp folder: a developer's ./.env (a DATABASE_URL, say) must not redirect the demo.
    child = spawn(process.execPath, [MAIN], { env, cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
    const c = child;
    c.stdout?.on('data', (chunk: Buffer) => (output += chunk.toString()));
    c.stderr?.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const url = await new Promise<string>((resolveUrl, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`the service did not start in ${START_TIMEOUT_MS / 1000} s:\n${output}`)),
        START_TIMEOUT_MS,
      );
      c.stdout?.on('data', () => {
        const match = /listening on (http:\/\/localhost:\d+)/.exec(output);
        if (match) {
          clearTimeout(timer);
          resolveUrl(match[1].replace('localhost', '127.0.0.1'));
        }
      });
      c.once('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`the service exited with ${code} before listening:\n${output}`));
      });
    });
    return { url, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

// ---------- main ----------

async function main(): Promise<number> {
  let service: Service | undefined;
  let interrupted = false;
  const onSignal = (signal: NodeJS.Signals) => {
    if (interrupted) return;
    interrupted = true;
    out();
    out(yellow(`${signal}: stopping`));
    void (service?.stop() ?? Promise.resolve()).finally(() => process.exit(130));
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  let webhookSecret: string | undefined;
  let whyNoWebhook = '';
  try {
    if (process.env.DEMO_URL) {
      baseUrl = process.env.DEMO_URL.replace(/\/+$/, '');
      apiKey = process.env.DEMO_API_KEY || DEV_API_CLIENT.secret;
      webhookSecret = process.env.DEMO_WEBHOOK_SECRET || undefined;
      whyNoWebhook =
        'DEMO_WEBHOOK_SECRET is not set, and a running service’s webhook secret cannot be guessed (set it to its PSP_WEBHOOK_SECRET).';
      out(bold(`idempotent-orders demo against ${baseUrl}`));
    } else {
      out(bold('idempotent-orders demo: starting the service on an embedded PostgreSQL in a temp folder…'));
      service = await startService();
      baseUrl = service.url;
      apiKey = DEV_API_CLIENT.secret;
      webhookSecret = DEV_WEBHOOK_SECRET;
      out(dim(`  listening on ${baseUrl} (stopped and removed at the end)`));
    }
    out(dim(`  every request carries Authorization: Bearer ${apiKey.slice(0, 4)}…`));
    await walk(webhookSecret, whyNoWebhook);
    out();
    out(green(bold(`All ${stepsRun.length} steps answered as narrated.`)));
    return 0;
  } catch (err) {
    // Interrupted: the requests in flight failed because the service is stopping, not because of it.
    if (interrupted) return 130;
    out();
    if (err instanceof DemoMismatch) out(red(bold(`✗ step ${stepNo}: ${err.message}`)));
    else {
      // fetch says only "fetch failed"; the reason (ECONNREFUSED, a timeout) is its cause.
      const cause = err instanceof Error && err.cause instanceof Error ? ` (${err.cause.message})` : '';
      out(red(bold(`✗ step ${stepNo}: ${err instanceof Error ? err.message : String(err)}${cause}`)));
    }
    return 1;
  } finally {
    if (!interrupted) await service?.stop();
  }
}

process.exitCode = await main();
