import { writeSync } from 'node:fs';
import { Inject, Injectable, Logger, type OnModuleDestroy, type OnModuleInit } from '@nestjs/common';
import { type AmqpConnectionManager, type ChannelWrapper, connect } from 'amqp-connection-manager';
import type { ConfirmChannel } from 'amqplib';
import { Database } from '@idempotent-orders/idempotency';
import { RelayLoop } from '#outbox-relay';
import { type AppConfig, printableUrl } from '../config/app-config.js';
import { APP_CONFIG } from '../config/config.module.js';
import { OrderEventsMetrics } from './order-events-metrics.js';
import { ORDER_EVENTS_EXCHANGE, type OrderEventMessage } from './order-events-outbox.js';

/**
 * How often an idle relay looks for due rows (one index scan of unsent rows: ten a second cost next to nothing). Polling,
 * not NOTIFY: a notifying commit takes a server-wide lock, which would serialise every create (see the migration).
 * It also works as is behind a transaction pooler, where LISTEN cannot.
 */
export const POLL_INTERVAL_MS = 100;
/** While the broker is away nothing is claimed; its 'connect' event wakes the relay, this only bounds a missed one. */
export const BROKER_DOWN_POLL_MS = 10_000;
/** Rows per round: enough to keep a confirm channel busy (publishes are pipelined, confirms arrive in bulk). */
export const BATCH_SIZE = 200;
/** A publish the broker has not confirmed in 5 s counts as failed: its row is due again (ORDER_EVENTS_LEASE_MS is longer). */
export const PUBLISH_TIMEOUT_MS = 5_000;
/** Retry of a row whose publish failed: 0.5 s · 2^(attempts-1), capped at 30 s, a quarter of jitter (SQL below). */
const BACKOFF_BASE_MS = 500;
const BACKOFF_CAP_MS = 30_000;
/** amqp-connection-manager's pause between connection attempts to a broker that is down. */
const RECONNECT_SECONDS = 1;
/**
 * A connection attempt's limit, handshake included: a frozen node (SIGSTOP, a suspended VM) accepts TCP in its kernel and
 * never answers, and amqplib waits for it forever unless told; given up, the next node of AMQP_URL is tried.
 */
export const CONNECT_TIMEOUT_MS = 5_000;

export type RelayState = 'off' | 'connected' | 'disconnected';

interface DueEvent {
  event_id: string;
  type: string;
  payload: OrderEventMessage;
  created_at: Date;
}

/**
 * Publishes the order events' outbox (migration 1764415500000) to RabbitMQ, at least once: the topic exchange
 * orders.events, routing key = type, persistent, messageId = event id, on a confirm channel. A row is marked sent
 * only after the broker's confirm; a crash between the confirm and the mark publishes it again (consumers dedupe
 * on messageId). docs/patterns/transactional-outbox.md says why each step is where it is.
 *
 * Rows are LEASED, not locked across the publishes: one statement claims a batch with FOR UPDATE SKIP LOCKED and
 * pushes available_at ORDER_EVENTS_LEASE_MS ahead, and commits; the publishes run with no transaction open. Several
 * instances share the work (each due row goes to one of them); a dead relay's rows are due again when the lease ends.
 * amqp-connection-manager reconnects after a broker restart; a publish not confirmed within PUBLISH_TIMEOUT_MS
 * (the broker went away mid-batch) is released with a short backoff and sent again on the new connection.
 */
@Injectable()
export class OrderEventsRelay implements OnModuleInit, OnModuleDestroy {
  private readonly logger = new Logger('OrderEventsRelay');
  private connection: AmqpConnectionManager | undefined;
  private channel: ChannelWrapper | undefined;
  /** Rounds, wakes and the stop: the shape this relay shares with the sandbox's webhook relay (#outbox-relay). */
  private readonly loop = new RelayLoop({
    round: () => this.runRound(),
    retryAfterErrorMs: POLL_INTERVAL_MS,
    logger: { warn: (message) => this.logger.warn(message) },
  });
  private brokerUp = false;

  constructor(
    private readonly db: Database,
    private readonly metrics: OrderEventsMetrics,
    @Inject(APP_CONFIG) private readonly config: AppConfig,
  ) {}

  /** off: AMQP_URL unset (events wait in the outbox); else whether the broker connection is up right now. */
  get state(): RelayState {
    if (!this.config.amqpUrls) return 'off';
    return this.brokerUp ? 'connected' : 'disconnected';
  }

  onModuleInit(): void {
    const { amqpUrls } = this.config;
    if (!amqpUrls) {
      this.logger.log('order events relay off (AMQP_URL unset): events wait in order_events_outbox');
      return;
    }
    this.connection = connect(amqpUrls, {
      reconnectTimeInSeconds: RECONNECT_SECONDS,
      heartbeatIntervalInSeconds: 5,
      connectionOptions: { timeout: CONNECT_TIMEOUT_MS },
    });
    this.connection.on('connect', () => {
      this.brokerUp = true;
      this.logger.log({ broker: amqpUrls.map(printableUrl).join(',') }, 'order events relay connected to RabbitMQ');
      // Up again: what waited meanwhile is due now.
      this.loop.wake();
    });
    this.connection.on('disconnect', ({ err }) => {
      // Once per outage, not once per reconnect attempt.
      if (this.brokerUp) this.logger.warn({ err: err?.message }, 'order events relay lost RabbitMQ; events wait in the outbox');
      this.brokerUp = false;
    });
    this.connection.on('connectFailed', ({ err }) =>
      this.logger.debug({ err: err?.message }, 'order events relay could not reach RabbitMQ'),
    );
    this.channel = this.connection.createChannel({
      name: 'order-events',
      confirm: true,
      publishTimeout: PUBLISH_TIMEOUT_MS,
      // Run on every (re)connect: the exchange is the contract's, asserted by both sides (idempotent).
      setup: (channel: ConfirmChannel) => channel.assertExchange(ORDER_EVENTS_EXCHANGE, 'topic', { durable: true }).then(() => undefined),
    });
    this.channel.on('error', (err: Error) => this.logger.warn({ err: err.message }, 'order events channel setup failed'));
    this.loop.start();
  }

  /** One round; never throws. Resolves with the wait until the next one. */
  private async runRound(): Promise<number> {
    try {
      // Nothing is claimed while the broker is away: the 'connect' event wakes the relay when it is back.
      if (!this.brokerUp || !this.channel) return BROKER_DOWN_POLL_MS;
      const due = await this.claimDue();
      if (due.length > 0) await this.publish(due);
      // Events are flowing: look again at once (the lag is then a round, not a poll); idle: poll.
      return due.length > 0 ? 0 : POLL_INTERVAL_MS;
    } catch (err) {
      this.logger.warn({ err: err instanceof Error ? err.message : String(err) }, 'order events relay round failed');
      return POLL_INTERVAL_MS;
    }
  }

  /** Claims and leases up to BATCH_SIZE due rows in one statement (its own transaction), oldest due first. */
  private claimDue(): Promise<DueEvent[]> {
    return this.db.query<DueEvent>(
      `UPDATE order_events_outbox o
          SET available_at = now() + $2::int * interval '1 millisecond', attempts = o.attempts + 1
         FROM (SELECT event_id FROM order_events_outbox
                WHERE sent_at IS NULL AND available_at <= now()
                ORDER BY available_at, created_at
                LIMIT $1
                FOR UPDATE SKIP LOCKED) due
        WHERE o.event_id = due.event_id
        RETURNING o.event_id, o.type, o.payload, o.created_at`,
      [BATCH_SIZE, this.config.orderEventsLeaseMs],
    );
  }

  /** Publishes a batch (pipelined on the confirm channel), then marks what was confirmed and releases what was not. */
  private async publish(due: DueEvent[]): Promise<void> {
    const channel = this.channel!;
    const outcomes = await Promise.allSettled(
      due.map((event) =>
        channel.publish(ORDER_EVENTS_EXCHANGE, event.type, Buffer.from(JSON.stringify(event.payload)), {
          persistent: true,
          contentType: 'application/json',
          messageId: event.event_id,
          type: event.type,
          timestamp: Math.floor(event.created_at.getTime() / 1000),
        }),
      ),
    );
    const confirmed = due.filter((_, i) => outcomes[i].status === 'fulfilled');
    const failed = due.flatMap((event, i) => {
      const outcome = outcomes[i];
      return outcome.status === 'rejected'
        ? [{ event, error: outcome.reason instanceof Error ? outcome.reason.message : String(outcome.reason) }]
        : [];
    });
    if (confirmed.length > 0 && this.config.orderEventsRelayFault === 'die-after-confirm') {
      // The at-least-once test's crash: the broker has these messages, the outbox does not know it.
      // Written synchronously: the logger buffers, and a line it still held would die with the process.
      writeSync(2, `ORDER_EVENTS_RELAY_FAULT=die-after-confirm: dying before marking ${confirmed.length} confirmed rows sent\n`);
      process.kill(process.pid, 'SIGKILL');
    }
    this.metrics.published.inc({ result: 'confirmed' }, confirmed.length);
    this.metrics.published.inc({ result: 'failed' }, failed.length);
    const now = Date.now();
    for (const event of confirmed) this.metrics.lag.observe((now - event.created_at.getTime()) / 1000);
    if (confirmed.length > 0) {
      await this.db.query(
        `UPDATE order_events_outbox SET sent_at = now(), last_error = NULL WHERE event_id = ANY($1::uuid[]) AND sent_at IS NULL`,
        [confirmed.map((e) => e.event_id)],
      );
    }
    if (failed.length > 0) {
      await this.db.query(
        `UPDATE order_events_outbox o
            SET available_at = now() + least($3::int, $2::int * power(2, least(o.attempts - 1, 16)))
                                       * (1 - 0.25 * random()) * interval '1 millisecond',
                last_error = f.error
           FROM unnest($1::uuid[], $4::text[]) AS f(event_id, error)
          WHERE o.event_id = f.event_id AND o.sent_at IS NULL`,
        [failed.map((f) => f.event.event_id), BACKOFF_BASE_MS, BACKOFF_CAP_MS, failed.map((f) => f.error)],
      );
      this.logger.warn(
        { failed: failed.length, error: failed[0].error },
        'order events not confirmed by RabbitMQ; due again after a backoff',
      );
    }
  }

  /**
   * Stops the rounds, waits for the running one (its confirmed rows get marked), then closes the channel and the
   * connection. Before the database pool closes (onApplicationShutdown), so the round's marks can still be written.
   */
  async onModuleDestroy(): Promise<void> {
    // Synchronously no new round from here on; the running one is awaited below.
    const rounds = this.loop.stop();
    await rounds;
    await this.channel?.close().catch(() => undefined);
    await this.connection?.close().catch(() => undefined);
  }
}
