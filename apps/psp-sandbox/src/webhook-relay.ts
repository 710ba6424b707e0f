import { Inject, Injectable, Logger, type OnModuleDestroy, type OnModuleInit } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { Server } from 'node:http';
import { Webhook } from 'standardwebhooks';
import { RelayLoop, retryDelayMs as backoffMs } from '#outbox-relay';
import { SandboxDatabase } from './sandbox-database.js';
import { selfUrl } from './self-url.js';
import { SANDBOX_OPTIONS, type SandboxOptions } from './sandbox-options.js';
import { OUTBOX_CHANNEL, type WebhookEventType } from './webhook-outbox.js';
import { WebhookMetrics, type WebhookDeliveryResult } from './webhook-metrics.js';

/**
 * docs/contract.md#sandbox-provider: without a listener (behind a transaction pooler, or while the LISTEN
 * connection is down) the relay looks for due events every 500 ms.
 */
export const POLL_INTERVAL_MS = 500;
/** While listening: a commit's NOTIFY wakes the relay; this slow poll only catches a notification that was missed. */
export const FALLBACK_POLL_MS = 10_000;

/** Per round: small, so one round's sends stay well inside the lease even when every one times out. */
export const BATCH_SIZE = 10;
/** A receiver that has not answered in 5 s is treated as down; its event is retried later. */
export const DELIVERY_TIMEOUT_MS = 5_000;
/**
 * How long a claimed row stays invisible to the other relays. It must outlast a round's sends
 * (they run in parallel, each bounded by DELIVERY_TIMEOUT_MS) plus the database writes after them:
 * a lease that ran out mid-send would let a second relay send the same row at the same time.
 * After a crash the row is due again when it runs out.
 */
export const LEASE_MS = 30_000;
/** docs/contract.md#sandbox-provider: 0.5 s · 2ⁿ, capped at 30 s. */
const BACKOFF_BASE_MS = 500;
const BACKOFF_CAP_MS = 30_000;
/** How often a non-empty backlog is logged, so a receiver that stays down shows in the logs without one line per round. */
const BACKLOG_LOG_INTERVAL_MS = 60_000;

/**
 * The wait before the next attempt after `failures` failed attempts (1 = the first one failed):
 * 0.5 s · 2^(failures-1), capped at 30 s, minus up to a quarter at random so the retries of many
 * events (or of many providers' instances) do not arrive in lockstep. Never above the cap.
 */
export function retryDelayMs(failures: number, random: () => number = Math.random): number {
  return backoffMs(failures, { baseMs: BACKOFF_BASE_MS, capMs: BACKOFF_CAP_MS }, random);
}

interface DueEvent {
  id: string;
  copy: number;
  type: WebhookEventType;
  payload: Record<string, unknown>;
  attempts: number;
  created_at: Date;
}

type Attempt =
  { result: 'delivered'; status: number } | { result: Exclude<WebhookDeliveryResult, 'delivered'>; error: string } | { result: 'aborted' };

/**
 * The sandbox's webhook sender: delivers the outbox (webhook-outbox.ts) at least once, signed per
 * Standard Webhooks, with backoff until a 2xx. One per process; any number of processes on one
 * database share the work.
 *
 * Rows are LEASED, not locked across the HTTP call: one statement claims a batch of due rows with
 * FOR UPDATE SKIP LOCKED and pushes their next_attempt_at LEASE_MS ahead, and commits; the sends
 * happen with no transaction open. Why not hold the row locks during the sends instead:
 * - a lock held across a call into an HTTP receiver ties a connection of the sandbox's 5 up for
 *   seconds per round (idle in transaction), which the provider's own charges need;
 * - when the receiver is this very process (`self`), the consumer runs while we wait. The consumer
 *   touches only the service's tables, never psp.* (so no deadlock today), but a lock-free send
 *   cannot deadlock with whatever it does tomorrow;
 * - a crash mid-send needs nothing to unlock: the lease runs out and the row is due again.
 * The price is the lease length: a row whose relay died mid-send waits up to LEASE_MS to be retried.
 * SKIP LOCKED keeps two relays' claims apart (each due row is claimed by one of them), and the
 * lease keeps the row away from the others while it is being sent.
 */
@Injectable()
export class WebhookRelay implements OnModuleInit, OnModuleDestroy {
  private readonly logger = new Logger('PspWebhookRelay');
  private readonly signer: Webhook;
  /** Aborts the sends in flight when the module stops, so app.close() does not wait out a slow receiver. */
  private readonly stopping = new AbortController();
  /** Rounds, wakes and the stop: the shape this relay shares with the order events relay (#outbox-relay). */
  private readonly loop = new RelayLoop({
    round: () => this.runRound(),
    retryAfterErrorMs: POLL_INTERVAL_MS,
    logger: { warn: (message) => this.logger.warn(message) },
  });
  private started = false;
  private lastBacklogLog = 0;
  private listener: { stop(): Promise<void> } | undefined;

  constructor(
    private readonly db: SandboxDatabase,
    @Inject(SANDBOX_OPTIONS) private readonly options: SandboxOptions,
    private readonly metrics: WebhookMetrics,
    private readonly host: HttpAdapterHost,
  ) {
    this.signer = new Webhook(options.webhooks.secret);
  }

  /** True while the relay polls (false when PSP_WEBHOOK_URL=none, and after the module stopped). */
  get running(): boolean {
    return this.started && !this.stopping.signal.aborted;
  }

  onModuleInit(): void {
    const { delivery, duplicates } = this.options.webhooks;
    if (delivery.to === 'none') {
      this.logger.log({ delivery: 'none' }, 'psp webhook delivery off (PSP_WEBHOOK_URL=none): events stay in psp.webhook_outbox');
      return;
    }
    this.logger.log({ delivery: delivery.to === 'url' ? delivery.url : 'self', duplicates }, 'psp webhook relay started');
    this.started = true;
    this.loop.start();
    void this.startListening();
  }

  /** LISTEN where it works (see SandboxDatabase.listen); polling every POLL_INTERVAL_MS where it does not. */
  private async startListening(): Promise<void> {
    try {
      const listener = await this.db.listen(OUTBOX_CHANNEL, {
        notified: () => this.loop.wake(),
        listening: (up) => {
          this.loop.listening = up;
          // Up again after a drop: notifications sent meanwhile are lost, so look now.
          if (up) this.loop.wake();
        },
      });
      if (this.stopping.signal.aborted) return void (await listener.stop());
      this.listener = listener;
      if (!listener.available)
        this.logger.log('psp webhook relay polls every 500 ms: a transaction pooler is in between, where LISTEN cannot work');
    } catch (err) {
      this.logger.warn({ err: err instanceof Error ? err.message : String(err) }, 'psp webhook listener failed to start; polling');
    }
  }

  /** Stops polling, aborts the sends in flight and waits for their round to record the outcome: no timer survives. */
  async onModuleDestroy(): Promise<void> {
    this.stopping.abort();
    // Synchronously no new round from here on; the running one is awaited below.
    const rounds = this.loop.stop();
    await this.listener?.stop();
    await rounds;
  }

  /**
   * One round; never throws (a failed round is logged and the next one tries again). Resolves with the wait until the
   * next: a full batch (or a notification during the round, which the loop handles) means more is due, so at once.
   * Otherwise, listening: at the next row's due time (a retry's backoff, a duplicate's spread, a lease running out),
   * at most FALLBACK_POLL_MS away; polling: POLL_INTERVAL_MS.
   */
  private async runRound(): Promise<number> {
    try {
      const url = this.targetUrl();
      // `self` before app.listen(): nothing to send to yet.
      if (!url) return POLL_INTERVAL_MS;
      const due = await this.claimDue();
      // allSettled: one failed bookkeeping write must not end the round (and let shutdown close the
      // pool) while the other sends are still in flight. A row whose write failed is retried when its lease runs out.
      const outcomes = await Promise.allSettled(due.map((event) => this.deliver(event, url)));
      for (const outcome of outcomes) {
        if (outcome.status === 'rejected')
          this.logger.warn(
            { err: outcome.reason instanceof Error ? outcome.reason.message : String(outcome.reason) },
            'psp webhook outcome not recorded; due again when its lease runs out',
          );
      }
      await this.logBacklog();
      if (due.length === BATCH_SIZE) return 0;
      return this.loop.listening ? await this.untilNextDue() : POLL_INTERVAL_MS;
    } catch (err) {
      this.logger.warn({ err: err instanceof Error ? err.message : String(err) }, 'psp webhook relay round failed');
      return POLL_INTERVAL_MS;
    }
  }

  /** ms until the earliest undelivered row is due (0 if one is due now), capped at FALLBACK_POLL_MS. */
  private async untilNextDue(): Promise<number> {
    const [next] = await this.db.query<{ ms: number | null }>(
      `SELECT ceil(extract(epoch FROM min(next_attempt_at) - now()) * 1000)::int AS ms FROM psp.webhook_outbox WHERE delivered_at IS NULL`,
    );
    return next.ms === null ? FALLBACK_POLL_MS : Math.min(FALLBACK_POLL_MS, Math.max(0, next.ms));
  }

  /** `self`: this service's /webhooks/psp on the port it listens on (0 in tests: known only once it listens). */
  private targetUrl(): string | undefined {
    const { delivery } = this.options.webhooks;
    if (delivery.to === 'url') return delivery.url;
    const address = (this.host.httpAdapter?.getHttpServer() as Server | undefined)?.address();
    if (!address || typeof address === 'string') return undefined;
    return `${selfUrl(address)}/webhooks/psp`;
  }

  /** Claims and leases up to BATCH_SIZE due rows in one statement (its own transaction), oldest due first. */
  private async claimDue(): Promise<DueEvent[]> {
    return this.db.query<DueEvent>(
      `UPDATE psp.webhook_outbox o SET next_attempt_at = now() + $2::int * interval '1 millisecond'
       FROM (
         SELECT id, copy FROM psp.webhook_outbox
         WHERE delivered_at IS NULL AND next_attempt_at <= now()
         ORDER BY next_attempt_at
         LIMIT $1
         FOR UPDATE SKIP LOCKED
       ) due
       WHERE o.id = due.id AND o.copy = due.copy
       RETURNING o.id, o.copy, o.type, o.payload, o.attempts, o.created_at`,
      [BATCH_SIZE, LEASE_MS],
    );
  }

  private async deliver(event: DueEvent, url: string): Promise<void> {
    const attempt = await this.send(event, url);
    const log = { webhookId: event.id, copy: event.copy, type: event.type, attempt: event.attempts + 1 };
    if (attempt.result === 'aborted') {
      // Shutting down: the send did not finish, so it does not count. Release the lease so the
      // next relay (or this service after its restart) sends it at once instead of after LEASE_MS.
      await this.db.query(`UPDATE psp.webhook_outbox SET next_attempt_at = now() WHERE id = $1 AND copy = $2 AND delivered_at IS NULL`, [
        event.id,
        event.copy,
      ]);
      this.logger.log(log, 'psp webhook send abandoned at shutdown; due again');
      return;
    }
    this.metrics.deliveries.inc({ result: attempt.result });
    if (attempt.result === 'delivered') {
      await this.db.query(
        `UPDATE psp.webhook_outbox SET delivered_at = now(), attempts = attempts + 1, last_error = NULL
         WHERE id = $1 AND copy = $2 AND delivered_at IS NULL`,
        [event.id, event.copy],
      );
      this.logger.log({ ...log, status: attempt.status }, 'psp webhook delivered');
      return;
    }
    const delayMs = retryDelayMs(event.attempts + 1);
    await this.db.query(
      `UPDATE psp.webhook_outbox
       SET attempts = attempts + 1, next_attempt_at = now() + $3::int * interval '1 millisecond', last_error = $4
       WHERE id = $1 AND copy = $2 AND delivered_at IS NULL`,
      [event.id, event.copy, delayMs, attempt.error],
    );
    this.logger.warn(
      { ...log, result: attempt.result, error: attempt.error, retryInMs: delayMs },
      'psp webhook delivery failed; will retry',
    );
  }

  /** One signed POST. The webhook-id is the event's, on every attempt and copy; the timestamp is this attempt's. */
  private async send(event: DueEvent, url: string): Promise<Attempt> {
    const body = JSON.stringify({ type: event.type, timestamp: event.created_at.toISOString(), data: event.payload });
    const now = new Date();
    try {
      const res = await fetch(url, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          'webhook-id': event.id,
          'webhook-timestamp': String(Math.floor(now.getTime() / 1000)),
          'webhook-signature': this.signer.sign(event.id, now, body),
        },
        body,
        // A redirect is not a delivery: the 3xx itself is the answer (and is retried).
        redirect: 'manual',
        signal: AbortSignal.any([AbortSignal.timeout(DELIVERY_TIMEOUT_MS), this.stopping.signal]),
      });
      // The body is not needed; dropping it frees the connection.
      await res.body?.cancel().catch(() => undefined);
      if (res.status >= 200 && res.status < 300) return { result: 'delivered', status: res.status };
      return { result: 'rejected', error: `HTTP ${res.status}` };
    } catch (err) {
      // Duck-typed, not instanceof: fetch's errors may come from another realm (Jest's VM contexts do this).
      const failure = err as { name?: string; message?: string; cause?: { code?: string; message?: string } } | undefined;
      // AbortError comes only from `stopping` (the timeout rejects with TimeoutError): a send that
      // failed on its own while we stopped is counted as the failure it was.
      if (failure?.name === 'AbortError' && this.stopping.signal.aborted) return { result: 'aborted' };
      if (failure?.name === 'TimeoutError') return { result: 'unreachable', error: `no answer within ${DELIVERY_TIMEOUT_MS} ms` };
      // "fetch failed" says nothing; its cause says ECONNREFUSED, ECONNRESET, ENOTFOUND…
      return { result: 'unreachable', error: failure?.cause?.code ?? failure?.cause?.message ?? failure?.message ?? String(err) };
    }
  }

  private async logBacklog(): Promise<void> {
    if (Date.now() - this.lastBacklogLog < BACKLOG_LOG_INTERVAL_MS) return;
    this.lastBacklogLog = Date.now();
    const [backlog] = await this.db.query<{ pending: number; oldest: Date | null }>(
      `SELECT count(*)::int AS pending, min(created_at) AS oldest FROM psp.webhook_outbox WHERE delivered_at IS NULL`,
    );
    if (backlog.pending > 0)
      this.logger.log({ pending: backlog.pending, oldestCreatedAt: backlog.oldest?.toISOString() }, 'psp webhook outbox backlog');
  }
}
