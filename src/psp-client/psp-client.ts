import { Logger } from '@nestjs/common';
import {
  DelegateBackoff,
  ExponentialBackoff,
  handleWhenResult,
  type IBackoff,
  type IRetryBackoffContext,
  isBrokenCircuitError,
  retry,
  timeout,
  TimeoutStrategy,
  type TimeoutPolicy,
  wrap,
} from 'cockatiel';
import { request as sendRequest } from 'undici';
import { monotonicNow } from '@idempotent-orders/idempotency';
import { simulatesFault } from '#psp-sandbox';
import {
  type AttemptResult,
  describeAttempt,
  isRetryable,
  judgeLookup,
  judgeWrite,
  type LookupPage,
  readListing,
  readLookup,
} from './attempt-result.js';
import { type BreakerCheck, ClientBreakers, PspBreaker } from './psp-breaker.js';
import { PspClientMetrics, type PspOperation } from './psp-client-metrics.js';
import { BACKOFF_INITIAL_MS, BACKOFF_MAX_MS, LOOKUP_BACKOFF_BUDGET_MS, type PspClientOptions } from './psp-client-options.js';
import { PspUnreachableError } from './psp-unreachable.error.js';
import {
  type ChargeRequest,
  isPspCharge,
  isPspRefund,
  problemDetail,
  type PspCharge,
  type PspRefund,
  type RefundRequest,
} from './psp-wire.js';
import { parseRetryAfter } from './retry-after.js';
import { attemptFits, planRetry } from './retry-plan.js';

export type { ChargeRequest, PspCharge, PspRefund, RefundRequest } from './psp-wire.js';
export { PspUnreachableError } from './psp-unreachable.error.js';

export type PspCallResult<T> =
  | { kind: 'succeeded'; value: T } // 201 from the provider (200 to a listing)
  | { kind: 'declined'; value: T } // 402 with a recorded failed charge/refund
  | { kind: 'refused'; status: number; detail: string } // 400/404/422: the provider refused the request itself; nothing recorded there
  | { kind: 'unknown'; reason: string } // timeouts, network errors, 409/429/5xx after every attempt, deadline reached, breaker opened mid-way. MAY have been charged.
  | { kind: 'breaker-open'; retryAfterSeconds: number }; // not called at all (breaker open before the first attempt)

/**
 * The most of an answer's body that is read: a charge or a page of lookups is a few KiB, and a provider (or
 * whatever stands in its way) that sends more must not make us buffer it. More is an answer we cannot read.
 */
export const MAX_RESPONSE_BYTES = 1024 * 1024;

/** Whom a write is for: the API client, and the source its charge was made with (a refund inherits the charge's). */
export interface WriteOrigin {
  clientId: string;
  source: string;
}

/** What a lookup must find in each record, or the answer is not about our payment (refund): ambiguous. */
export type RecordCheck<T> = (record: T) => string | undefined;

/** A lookup's end: it is never declined. */
type LookupResult<T> = Exclude<PspCallResult<LookupPage<T>>, { kind: 'declined' }>;

/** The page of a listing of charges to ask for (GET /charges?createdAfter=…&startingAfter=…&limit=…). */
export interface ChargesPage {
  /** Charges created strictly after this instant. */
  createdAfter: Date;
  /** The previous page's last id: the page after it. */
  startingAfter?: string;
  /** At most this many (the provider's default without it: the sandbox's is 100, its most). */
  limit?: number;
}

/** An outbound Idempotency-Key: visible ASCII, as an HTTP header value must be, and short enough for any provider. */
const OUTBOUND_KEY = /^[\x21-\x7e]{1,255}$/;

interface OutboundRequest {
  operation: PspOperation;
  method: 'GET' | 'POST';
  url: string;
  /** Serialised once, so every attempt sends the same bytes under the same key (the provider compares them). */
  body?: string;
  outboundKey?: string;
  judge: (status: number, body: unknown) => AttemptResult['verdict'];
}

/** How a logical call ended, before it is mapped to what the caller sees. */
type CallEnd =
  | { kind: 'breaker-open'; retryAfterSeconds: number }
  | { kind: 'no-time' }
  | { kind: 'failed'; error: unknown }
  | {
      kind: 'answered';
      result: AttemptResult;
      attempts: number;
      last: AttemptResult | undefined;
      stopReason: string | undefined;
      earlierUnknown: boolean;
    };

/**
 * The outbound client to the payment provider (docs/contract.md#outbound-client): `wrap(breaker, retry, timeout)` from
 * cockatiel around one HTTP request (undici) per attempt, every attempt carrying the same Idempotency-Key, so a
 * retry can only ever find the charge the first attempt made, never make a second one.
 *
 * Refunds share the charges breaker: both are writes to the same provider API, so an outage shows
 * in either and should stop both; one breaker sees all write traffic and opens sooner, and the
 * payments module can check `chargeBreakerOpen()` before reserving a refund as it does before a
 * charge. Lookups have their own, so the reconciler can still ask while writes are failing.
 * A write with one of the sandbox's fault tokens has a breaker of its client's own instead (`writesBreaker`).
 */
export class PspClient {
  private readonly logger = new Logger('PspClient');
  private readonly writes: PspBreaker;
  private readonly testTokenWrites: ClientBreakers;
  private readonly lookups: PspBreaker;
  /**
   * Cooperative: the timeout aborts the attempt's signal, the request rejects (connect, headers or body)
   * and the attempt returns a `timeout` result itself, so every attempt is logged and counted with
   * what happened to it. The signal is also aborted when the attempt returns, which is why the body
   * is read inside it.
   */
  private readonly timeout: TimeoutPolicy;
  private readonly backoff: ExponentialBackoff<unknown>;

  constructor(
    private readonly options: PspClientOptions,
    private readonly metrics: PspClientMetrics,
  ) {
    for (const name of ['timeoutMs', 'maxAttempts', 'breakerThreshold', 'breakerHalfOpenMs'] as const) {
      if (!Number.isSafeInteger(options[name]) || options[name] < 1)
        throw new RangeError(`PspClient: ${name} must be a positive integer, got ${options[name]}`);
    }
    // Sent as a header value on every attempt: a key that cannot be one would fail every call at the first.
    if (!/^[\x21-\x7e]+$/.test(options.apiKey)) throw new TypeError('PspClient: apiKey must be visible ASCII characters without spaces');
    this.writes = new PspBreaker('charges', options.breakerHalfOpenMs, options.breakerThreshold);
    this.lookups = new PspBreaker('lookups', options.breakerHalfOpenMs, options.breakerThreshold);
    // Not watched by the psp_breaker_state gauge: it shows the provider's state, and these show clients' choices.
    this.testTokenWrites = new ClientBreakers('charges', options.breakerHalfOpenMs, options.breakerThreshold);
    metrics.watch(this.writes);
    metrics.watch(this.lookups);
    this.timeout = timeout(options.timeoutMs, TimeoutStrategy.Cooperative);
    this.backoff = new ExponentialBackoff({
      initialDelay: options.backoffInitialMs ?? BACKOFF_INITIAL_MS,
      maxDelay: options.backoffMaxMs ?? BACKOFF_MAX_MS,
    });
  }

  /**
   * True when the breaker of a charge or refund for `origin` is open right now: the caller answers 503
   * provider-unavailable before writing anything.
   */
  chargeBreakerOpen(origin: WriteOrigin): BreakerCheck {
    return this.writesBreaker(origin).check();
  }

  /**
   * `deadline` (monotonic ms, monotonicNow()): no attempt starts, and no Retry-After is waited out, that
   * would end after it. An answer whose amount, currency or ids differ from the request is not a success.
   * `clientId`: the API client it is for, which picks its breaker with `body.source`.
   */
  createCharge(body: ChargeRequest, outboundKey: string, deadline: number, clientId: string): Promise<PspCallResult<PspCharge>> {
    const breaker = this.writesBreaker({ clientId, source: body.source });
    return this.write('charge', '/charges', body, outboundKey, deadline, breaker, isPspCharge, (c) => chargeMismatch(c, body));
  }

  createRefund(body: RefundRequest, outboundKey: string, deadline: number, origin: WriteOrigin): Promise<PspCallResult<PspRefund>> {
    const breaker = this.writesBreaker(origin);
    return this.write('refund', '/refunds', body, outboundKey, deadline, breaker, isPspRefund, (r) => refundMismatch(r, body));
  }

  private writesBreaker(origin: WriteOrigin): PspBreaker {
    // A call with one of the sandbox's fault tokens (tok_unavailable, tok_lost, …) counts against its client's own breaker:
    // that outage is the client's choice. Every other call counts against the shared one: a provider's failures are everybody's.
    return simulatesFault(origin.source) ? this.testTokenWrites.of(origin.clientId) : this.writes;
  }

  /**
   * Throws PspUnreachableError when the provider cannot tell (unreachable, our request refused, or an
   * answer about another payment or amount); [] means it has none.
   */
  findChargesByPayment(paymentId: string, expected: { amountMinor: number; currency: string }): Promise<PspCharge[]> {
    const found = this.lookup(
      'lookup-charges',
      '/charges',
      { paymentId },
      (body) => readLookup(body, isPspCharge),
      (c) =>
        mismatch(
          [c.metadata.paymentId, paymentId, 'metadata.paymentId'],
          [c.amountMinor, expected.amountMinor, 'amountMinor'],
          [c.currency, expected.currency, 'currency'],
        ),
    );
    return itemsOrThrow('lookup-charges', found);
  }

  findRefundsByRefund(refundId: string, expected: { paymentId: string; amountMinor: number }): Promise<PspRefund[]> {
    const found = this.lookup(
      'lookup-refunds',
      '/refunds',
      { refundId },
      (body) => readLookup(body, isPspRefund),
      (r) =>
        mismatch(
          [r.metadata.refundId, refundId, 'metadata.refundId'],
          [r.metadata.paymentId, expected.paymentId, 'metadata.paymentId'],
          [r.amountMinor, expected.amountMinor, 'amountMinor'],
        ),
    );
    return itemsOrThrow('lookup-refunds', found);
  }

  /**
   * One page of the provider's charges created after `page.createdAfter`, in its (createdAt, id) order; while hasMore,
   * ask for the next with startingAfter = the last item's id. `deadline` as for a write. Unknown when an item is not a
   * charge or hasMore is missing: a page with a hole in it could hide exactly the charge a sweep looks for.
   */
  listCharges(page: ChargesPage, deadline: number): Promise<PspCallResult<{ items: PspCharge[]; hasMore: boolean }>> {
    assertMonotonic('listCharges', deadline);
    const query: Record<string, string> = { createdAfter: page.createdAfter.toISOString() };
    if (page.startingAfter !== undefined) query.startingAfter = page.startingAfter;
    if (page.limit !== undefined) query.limit = String(page.limit);
    // Nothing of ours to compare a charge with: finding the ones we do not know is the point.
    return this.lookup(
      'list-charges',
      '/charges',
      query,
      (body) => readListing(body, isPspCharge),
      () => undefined,
      deadline,
    );
  }

  private async write<T extends { status: string }>(
    operation: 'charge' | 'refund',
    path: string,
    body: ChargeRequest | RefundRequest,
    outboundKey: string,
    deadline: number,
    breaker: PspBreaker,
    isRecord: (v: unknown) => v is T,
    check: RecordCheck<T>,
  ): Promise<PspCallResult<T>> {
    // Programming errors, not provider outcomes: fail loudly before anything is sent.
    if (!OUTBOUND_KEY.test(outboundKey)) throw new TypeError(`PspClient.${operation}: outboundKey must be 1-255 visible ASCII characters`);
    assertMonotonic(operation, deadline);
    const end = await this.call(breaker, deadline, {
      operation,
      method: 'POST',
      url: this.url(path),
      body: JSON.stringify(body),
      outboundKey,
      judge: (status, parsed) => judgeWrite(status, parsed, isRecord),
    });
    let result = this.toWriteResult(end, isRecord);
    const disagreement = result.kind === 'succeeded' || result.kind === 'declined' ? check(result.value) : undefined;
    if (disagreement) {
      // Not our charge as we asked for it (a provider bug, a proxy mixing answers): never settle on it.
      this.logger.error(
        { operation, outboundKey, disagreement, alert: true },
        'the provider answered about something else than we asked for; treated as unknown',
      );
      result = { kind: 'unknown', reason: `the answer does not match the request: ${disagreement}` };
    }
    this.metrics.calls.inc({ operation, outcome: result.kind });
    const fields = {
      operation,
      outboundKey,
      outcome: result.kind,
      ...('reason' in result ? { reason: result.reason } : {}),
      ...('status' in result ? { status: result.status } : {}),
    };
    if (result.kind === 'unknown' || result.kind === 'breaker-open') this.logger.warn(fields, 'psp call outcome unknown or not attempted');
    // An answer is the success path: at debug, so that the default level writes nothing per call.
    else this.logger.debug(fields, 'psp call answered');
    return result;
  }

  private toWriteResult<T>(end: CallEnd, isRecord: (v: unknown) => v is T): PspCallResult<T> {
    switch (end.kind) {
      case 'breaker-open':
        return { kind: 'breaker-open', retryAfterSeconds: end.retryAfterSeconds };
      case 'no-time':
        return { kind: 'unknown', reason: 'the deadline leaves no time for an attempt' };
      case 'failed':
        return { kind: 'unknown', reason: `unexpected error: ${errorMessage(end.error)}` };
      case 'answered': {
        const { result } = end;
        if (result.kind === 'response' && result.verdict === 'definitive' && isRecord(result.body)) {
          return { kind: result.status === 201 ? 'succeeded' : 'declined', value: result.body };
        }
        // A refusal says nothing of an earlier attempt under the same key whose outcome is unknown (a timeout may still
        // land; a gateway or a config change can answer the retry 404/422): only a refusal of every attempt is final.
        if (result.kind === 'response' && result.verdict === 'refused' && !end.earlierUnknown) {
          return { kind: 'refused', status: result.status, detail: problemDetail(result.status, result.body) };
        }
        return { kind: 'unknown', reason: unknownReason(end) };
      }
    }
  }

  /** One GET on the lookups breaker, read by `read`, each record checked; every end counted and logged here. */
  private async lookup<T>(
    operation: 'lookup-charges' | 'lookup-refunds' | 'list-charges',
    path: string,
    query: Record<string, string>,
    read: (body: unknown) => LookupPage<T> | undefined,
    check: RecordCheck<T>,
    // A lookup by id has no caller deadline: the same budget as the lease check gives a write.
    deadline = monotonicNow() + this.options.maxAttempts * this.options.timeoutMs + LOOKUP_BACKOFF_BUDGET_MS,
  ): Promise<LookupResult<T>> {
    const url = new URL(this.url(path));
    for (const [name, value] of Object.entries(query)) url.searchParams.set(name, value);
    const end = await this.call(this.lookups, deadline, {
      operation,
      method: 'GET',
      url: url.href,
      judge: (status, parsed) => judgeLookup(status, parsed, read),
    });
    if (end.kind === 'answered' && end.result.kind === 'response' && end.result.verdict === 'definitive') {
      const page = read(end.result.body)!;
      const disagreement = page.items.map(check).find((d) => d !== undefined);
      if (disagreement) {
        this.metrics.calls.inc({ operation, outcome: 'unknown' });
        this.logger.error(
          { operation, query, disagreement, alert: true },
          'the provider answered a lookup with a record that is not ours as we know it; treated as no answer',
        );
        return { kind: 'unknown', reason: `the answer does not match: ${disagreement}` };
      }
      this.metrics.calls.inc({ operation, outcome: 'ok' });
      this.logger.debug({ operation, query, found: page.items.length }, 'psp lookup answered');
      return { kind: 'succeeded', value: page };
    }
    if (end.kind === 'answered' && end.result.kind === 'response' && end.result.verdict === 'refused') {
      // 400/404/422 to a lookup we made: our request is wrong (a bug or a misconfigured PSP_BASE_URL), not the provider away.
      this.metrics.calls.inc({ operation, outcome: 'refused' });
      this.logger.error(
        { operation, query, status: end.result.status, alert: true },
        'the provider refused our lookup: a fault on our side',
      );
      return { kind: 'refused', status: end.result.status, detail: problemDetail(end.result.status, end.result.body) };
    }
    if (end.kind === 'breaker-open') {
      this.metrics.calls.inc({ operation, outcome: 'breaker-open' });
      this.logger.warn(
        { operation, query, outcome: 'breaker-open', retryAfterSeconds: end.retryAfterSeconds },
        'psp lookup could not be answered',
      );
      return { kind: 'breaker-open', retryAfterSeconds: end.retryAfterSeconds };
    }
    const reason =
      end.kind === 'failed'
        ? `unexpected error: ${errorMessage(end.error)}`
        : end.kind === 'no-time'
          ? 'no time for an attempt'
          : unknownReason(end);
    this.metrics.calls.inc({ operation, outcome: 'unreachable' });
    this.logger.warn({ operation, query, outcome: 'unreachable', reason }, 'psp lookup could not be answered');
    return { kind: 'unknown', reason };
  }

  /**
   * One logical call: every attempt inside one breaker sample. The retry policy is built per call
   * because its backoff reads this call's deadline and records why it stopped; the breaker and the
   * timeout are shared.
   */
  private async call(breaker: PspBreaker, deadline: number, request: OutboundRequest): Promise<CallEnd> {
    const check = breaker.check();
    if (check.open) return { kind: 'breaker-open', retryAfterSeconds: check.retryAfterSeconds };
    if (!attemptFits(monotonicNow(), deadline, this.options.timeoutMs)) return { kind: 'no-time' };

    const { timeoutMs, maxAttempts } = this.options;
    let attempts = 0;
    let last: AttemptResult | undefined;
    // Whether an attempt before the last one was sent and may have been recorded (its outcome unknown).
    let earlierUnknown = false;
    // Set by the backoff when the next attempt must not happen; the attempt then returns 'skipped'
    // unsent. (cockatiel's retry cannot be told to stop from a backoff, so it waits 0 ms and asks.)
    let stopReason: string | undefined;

    const backoff = new DelegateBackoff<IRetryBackoffContext<unknown>, IBackoff<unknown> | undefined>((context, previous) => {
      const jitter = previous ? previous.next(context) : this.backoff.next();
      const result = 'value' in context.result ? (context.result.value as AttemptResult) : undefined;
      const plan = breaker.isOpen
        ? ({ retry: false, reason: `the ${breaker.name} breaker opened while retrying` } as const)
        : planRetry({
            now: monotonicNow(),
            deadline,
            timeoutMs,
            backoffMs: jitter.duration,
            retryAfterMs: result?.kind === 'response' ? result.retryAfterMs : undefined,
          });
      if (!plan.retry) {
        stopReason = plan.reason;
        return { delay: 0, state: jitter };
      }
      this.logger.log(
        { operation: request.operation, outboundKey: request.outboundKey, nextAttempt: attempts + 1, delayMs: Math.round(plan.delayMs) },
        'psp retry scheduled',
      );
      return { delay: plan.delayMs, state: jitter };
    });
    // cockatiel's maxAttempts counts retries, not attempts.
    const retryPolicy = retry(
      handleWhenResult((r) => isRetryable(r as AttemptResult)),
      { maxAttempts: maxAttempts - 1, backoff },
    );

    try {
      const result = await wrap(breaker.policy, retryPolicy, this.timeout).execute(async ({ signal }): Promise<AttemptResult> => {
        if (stopReason) return { kind: 'skipped', verdict: 'unknown' };
        // Again at the start, as other calls may have opened the breaker while this one waited out a Retry-After.
        if (attempts > 0 && breaker.isOpen) {
          stopReason = `the ${breaker.name} breaker opened while retrying`;
          return { kind: 'skipped', verdict: 'unknown' };
        }
        // Also here, not only in the plan: a late timer or a busy event loop can start the attempt later than planned.
        if (!attemptFits(monotonicNow(), deadline, timeoutMs)) {
          stopReason = 'the deadline leaves no time for another attempt';
          return { kind: 'skipped', verdict: 'unknown' };
        }
        attempts += 1;
        if (last?.verdict === 'unknown' && last.kind !== 'skipped') earlierUnknown = true;
        last = await this.attempt(request, attempts, signal);
        return last;
        // A signal of this call's own: without one, cockatiel hangs every call's timeout listener on one shared,
        // never-aborted signal, and more than 10 calls in flight print a (false) "possible memory leak" warning.
      }, new AbortController().signal);
      return { kind: 'answered', result, attempts, last, stopReason, earlierUnknown };
    } catch (error) {
      if (isBrokenCircuitError(error)) {
        // Opened between our check and the call: still not called at all.
        const now = breaker.check();
        return { kind: 'breaker-open', retryAfterSeconds: now.open ? now.retryAfterSeconds : 1 };
      }
      this.logger.error({ operation: request.operation, outboundKey: request.outboundKey, err: error }, 'psp call failed unexpectedly');
      return { kind: 'failed', error };
    }
  }

  /** One HTTP exchange, body included, judged; never throws for what the network or the provider does. */
  private async attempt(request: OutboundRequest, attempt: number, signal: AbortSignal): Promise<AttemptResult> {
    const started = monotonicNow();
    let result: AttemptResult;
    try {
      const headers: Record<string, string> = { accept: 'application/json', authorization: `Bearer ${this.options.apiKey}` };
      if (request.body !== undefined) headers['content-type'] = 'application/json';
      if (request.outboundKey) headers['idempotency-key'] = request.outboundKey;
      // undici's request rather than the global fetch: the same client without WHATWG streams and Request/Response objects,
      // which cost about a quarter of the service's CPU per pay (bench/README.md). It follows no redirect: a payment
      // request is never re-sent to wherever a 3xx points; it is an unknown outcome.
      const response = await sendRequest(request.url, { method: request.method, headers, body: request.body, signal });
      const text = await readBounded(response.body, MAX_RESPONSE_BYTES);
      if (text === undefined) throw new OversizedAnswer();
      const body = parseJson(text);
      const retryAfter = response.headers['retry-after'];
      result = {
        kind: 'response',
        status: response.statusCode,
        body,
        retryAfterMs: parseRetryAfter(Array.isArray(retryAfter) ? retryAfter[0] : retryAfter, Date.now()),
        verdict: request.judge(response.statusCode, body),
      };
    } catch (error) {
      // The only abort is the per-attempt timeout's.
      result = signal.aborted
        ? { kind: 'timeout', message: `no complete answer within ${this.options.timeoutMs} ms`, verdict: 'unknown' }
        : error instanceof OversizedAnswer
          ? { kind: 'network', message: `the answer's body is over ${MAX_RESPONSE_BYTES} bytes`, verdict: 'unknown' }
          : { kind: 'network', message: errorMessage(error), verdict: 'unknown' };
    }
    const label = result.kind === 'response' ? String(result.status) : result.kind;
    this.metrics.attempts.inc({ operation: request.operation, result: label });
    const fields = {
      operation: request.operation,
      attempt,
      outboundKey: request.outboundKey,
      ...(result.kind === 'response' ? { status: result.status, retryAfterMs: result.retryAfterMs } : { error: describeAttempt(result) }),
      durationMs: Math.round(monotonicNow() - started),
    };
    if (result.verdict === 'unknown') this.logger.warn(fields, 'psp attempt without a definite answer');
    else this.logger.debug(fields, 'psp attempt answered');
    return result;
  }

  private url(path: string): string {
    return this.options.baseUrl().replace(/\/+$/, '') + path;
  }
}

/** An epoch-ms deadline (Date.now() + …) would be decades away on the monotonic clock: no deadline at all. */
function assertMonotonic(operation: string, deadline: number): void {
  if (!Number.isFinite(deadline) || deadline > monotonicNow() + 86_400_000)
    throw new TypeError(`PspClient.${operation}: deadline must be monotonic milliseconds (monotonicNow() + ms)`);
}

/**
 * A lookup by id's records, or PspUnreachableError: "the provider has none" and "we could not ask" lead to opposite
 * decisions (fail the payment vs. keep it pending), so no answer is never an empty list.
 */
async function itemsOrThrow<T>(operation: string, found: Promise<LookupResult<T>>): Promise<T[]> {
  const result = await found;
  switch (result.kind) {
    case 'succeeded':
      return result.value.items;
    case 'refused':
      // Still no answer: "none found" from a refusal would fail a payment that may have been charged.
      throw new PspUnreachableError(operation, `the provider refused the lookup (HTTP ${result.status})`);
    case 'breaker-open':
      throw new PspUnreachableError(operation, `lookups breaker open, retry in ${result.retryAfterSeconds} s`);
    case 'unknown':
      throw new PspUnreachableError(operation, result.reason);
  }
}

function unknownReason(end: Extract<CallEnd, { kind: 'answered' }>): string {
  const tried = `${end.attempts} attempt${end.attempts === 1 ? '' : 's'}`;
  const last = describeAttempt(end.last);
  if (end.stopReason) return `${end.stopReason}; last of ${tried}: ${last}`;
  return `${last} after ${tried}`;
}

class OversizedAnswer extends Error {}

/** The body as text, or undefined once it passes `limit` bytes (the rest is not read: the stream is destroyed). */
async function readBounded(body: AsyncIterable<Uint8Array>, limit: number): Promise<string | undefined> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  // Leaving the loop early destroys the stream (and its connection): the rest of an oversized body is never read.
  for await (const chunk of body) {
    size += chunk.byteLength;
    if (size > limit) return undefined;
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString('utf8');
}

type Comparison = [theirs: string | number, ours: string | number, field: string];

/** "amountMinor 2400 ≠ ours 2500"-style text for the fields that differ; undefined when all agree. */
function mismatch(...pairs: Comparison[]): string | undefined {
  const differing = pairs.filter(([theirs, ours]) => theirs !== ours).map(([theirs, ours, field]) => `${field} ${theirs} ≠ ours ${ours}`);
  return differing.length ? differing.join(', ') : undefined;
}

const chargeMismatch = (c: PspCharge, asked: ChargeRequest) =>
  mismatch(
    [c.amountMinor, asked.amountMinor, 'amountMinor'],
    [c.currency, asked.currency, 'currency'],
    [c.metadata.paymentId, asked.metadata.paymentId, 'metadata.paymentId'],
    [c.metadata.orderId, asked.metadata.orderId, 'metadata.orderId'],
  );

const refundMismatch = (r: PspRefund, asked: RefundRequest) =>
  mismatch(
    [r.amountMinor, asked.amountMinor, 'amountMinor'],
    [r.chargeId, asked.chargeId, 'chargeId'],
    [r.metadata.refundId, asked.metadata.refundId, 'metadata.refundId'],
    [r.metadata.paymentId, asked.metadata.paymentId, 'metadata.paymentId'],
  );

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

/** The error's message with its code (ECONNREFUSED, UND_ERR_SOCKET), or its cause's when the code is there. */
function errorMessage(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const own = (error as { code?: unknown }).code;
  const cause = error.cause as { code?: unknown; message?: unknown } | undefined;
  const detail =
    typeof own === 'string'
      ? own
      : typeof cause?.code === 'string'
        ? cause.code
        : typeof cause?.message === 'string'
          ? cause.message
          : undefined;
  return detail && !error.message.includes(detail) ? `${error.message} (${detail})` : error.message;
}
