import {
  applyDecorators,
  type CallHandler,
  type ExecutionContext,
  Inject,
  Injectable,
  Logger,
  type NestInterceptor,
  Optional,
  SetMetadata,
  UseInterceptors,
} from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { from, lastValueFrom, type Observable } from 'rxjs';
import type { QueryRunner } from 'typeorm';
import { Database, PoolExhaustedError } from './database.js';
import { isContention, isDatabaseUnavailable } from './pg-errors.js';
import { deleteInBatches } from './delete-in-batches.js';
import { IdempotencyMetrics } from './idempotency-metrics.js';

/**
 * The consumer side of the layer: `@IdempotentMessage({ consumer })` on an `@EventPattern` handler of a broker
 * microservice (RabbitMQ through @nestjs/microservices, `noAck: false`). Per delivery, in ONE transaction of
 * `Database`: the mark (consumer, message id) is claimed, then the handler writes its effect through `Database`;
 * the ack is sent only after COMMIT. A redelivery (a crash between COMMIT and ack, a duplicate publish, a second
 * consumer) finds the mark, commits nothing and is acked. A failure rolls both back and the message is sent
 * back (nack + requeue) until its last attempt, then dead-lettered (nack without requeue → the queue's DLX).
 * With `batch` (a group commit), deliveries arriving together share ONE transaction, each under a savepoint of its
 * own, and each is acked after that COMMIT.
 * Why each step is where it is: docs/patterns/message-consumer.md.
 */

export const IDEMPOTENT_MESSAGE = Symbol('IDEMPOTENT_MESSAGE');
// Backoff while the database is unavailable: quick for a blip, at most one try per 5 s per held message during an outage.
const HOLD_FIRST_MS = 100;
const HOLD_MAX_MS = 5_000;
/**
 * Tries of one delivery that meets a lock timeout, deadlock, serialization failure or statement cancel (isContention)
 * before it is sent back (nack) as a failed attempt: a blip passes within them, and a message whose effect meets one
 * every time uses up its attempts and is dead-lettered instead of being held forever.
 */
const CONTENDED_TRIES_PER_DELIVERY = 3;
/** A held delivery whose channel closed: not settled (it cannot be), the broker delivers it again on a new channel. */
const DROPPED = Symbol('dropped');
const IDENTIFIER = /^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?$/;

/** What the layer needs of the transport's context: RmqContext of @nestjs/microservices has exactly these. */
export interface BrokerMessageContext {
  getMessage(): unknown;
  getChannelRef(): unknown;
}

interface AmqpMessage {
  properties: { messageId?: string; headers?: Record<string, unknown> };
}
interface AmqpChannel {
  ack(message: unknown): void;
  nack(message: unknown, allUpTo?: boolean, requeue?: boolean): void;
  /** amqplib's channel is an EventEmitter: its 'close' says that its unsettled deliveries went back to the queue. */
  once?(event: 'close', listener: () => void): unknown;
}

/** A channel as the held deliveries see it: closed or not, and who to wake when it closes. */
interface WatchedChannel {
  closed: boolean;
  wake: Set<() => void>;
}

export type MessageOutcome = 'applied' | 'duplicate' | 'retried' | 'dead-lettered';

export interface IdempotentMessageOptions {
  /** Who consumes: marks are per consumer, so two consumers of one event each apply it once. */
  consumer: string;
  /** The marks' table, schema-qualified if needed (created by `createProcessedMessagesTable`). Default `processed_messages`. */
  table?: string;
  /** The message's identity. Default: the AMQP `messageId` property (the producer's event id). */
  key?: (data: unknown, message: AmqpMessage) => string | undefined;
  /**
   * Deliveries before a failing message is dead-lettered. Counted by the broker (`x-delivery-count`, which a
   * quorum queue sets): a count kept in this process would restart with it. Default: the app's
   * IDEMPOTENT_MESSAGE_DEFAULTS provider (its configuration, known only at start-up), else 5.
   */
  maxAttempts?: number;
  /**
   * Group commit: deliveries that arrive within `waitMs` of the first (up to `size`) share one transaction, one
   * savepoint per message, and are acked after its COMMIT. Default: the app's IDEMPOTENT_MESSAGE_DEFAULTS, else none
   * (one transaction per message). `size` at most 50: PostgreSQL keeps 64 subtransactions per backend in shared memory.
   */
  batch?: MessageBatching;
}

export interface MessageBatching {
  /** Most deliveries per transaction (2–50; 1 = one transaction per message). */
  size: number;
  /** How long the first delivery of a batch waits for others (ms). */
  waitMs: number;
}

/** Provide this token (e.g. `{ maxAttempts: config.maxAttempts }`) to set what decorators leave unset. */
export const IDEMPOTENT_MESSAGE_DEFAULTS = Symbol('IDEMPOTENT_MESSAGE_DEFAULTS');
export interface IdempotentMessageDefaults {
  maxAttempts?: number;
  batch?: MessageBatching;
  /** Tests' fault hook: runs after a batch's COMMIT, before its acks, with the ids it committed. */
  afterBatchCommit?: (messageIds: string[]) => void;
}
type ResolvedMessageOptions = Required<Omit<IdempotentMessageOptions, 'maxAttempts' | 'batch'>> &
  Pick<IdempotentMessageOptions, 'maxAttempts' | 'batch'>;
export const MAX_BATCH_SIZE = 50;
// The marks' CHECK: a longer id would fail a batch's one claim for all of its messages, so it goes alone.
const MAX_MESSAGE_ID_LENGTH = 255;

/** One delivery on its way through the layer: settled (acked or nacked) exactly once, then `done`. */
interface Delivery {
  options: ResolvedMessageOptions;
  messageId: string;
  attempt: number;
  message: AmqpMessage;
  channel: AmqpChannel;
  next: CallHandler;
  done: () => void;
}
type BatchResult = { applied: boolean } | { err: unknown };

/** Attempts so far, this one included: the quorum queue's `x-delivery-count` counts earlier deliveries. */
export function deliveryAttempt(message: AmqpMessage): number {
  const count = Number(message.properties.headers?.['x-delivery-count'] ?? 0);
  return (Number.isSafeInteger(count) && count >= 0 ? count : 0) + 1;
}

/** The claim ($1 consumer, $2 message id): a row back means this delivery is the first and goes on to the effect. */
export const claimMessageStatement = (table: string) =>
  `INSERT INTO ${table} (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1`;

/**
 * A batch's claim ($1 consumer, $2 message ids, distinct and sorted): the ids that came back are this batch's to
 * apply. Sorted, so two batches claiming overlapping ids take their row locks in one order (no deadlock on marks).
 */
export const claimMessagesStatement = (table: string) =>
  `INSERT INTO ${table} (consumer, message_id) SELECT $1, id FROM unnest($2::text[]) AS id ON CONFLICT DO NOTHING RETURNING message_id`;

/**
 * A line's fields as `name value, …`: plain text, which Nest's default logger prints on one line and a structured
 * logger still gets whole (an object first would print as `Object(n)` there).
 */
function described(fields: Record<string, unknown>): string {
  return Object.entries(fields)
    .filter(([, value]) => value !== undefined)
    .map(([name, value]) => `${name} ${value instanceof Error ? value.message : JSON.stringify(value)}`)
    .join(', ');
}

/** The database away, refusing connections, or no connection free: nothing about the message, held for as long as it lasts. */
const databaseUnavailable = (err: unknown) => isDatabaseUnavailable(err) || err instanceof PoolExhaustedError;
/** Errors that need not be the message's: the database unavailable, a lock wait, deadlock or statement lost. */
const notTheMessages = (err: unknown) => databaseUnavailable(err) || isContention(err);

@Injectable()
export class IdempotentMessageInterceptor implements NestInterceptor {
  private readonly logger = new Logger('IdempotentMessage');
  /** Each channel deliveries came on, watched once for its close (weakly: a closed channel is let go). */
  private readonly channels = new WeakMap<AmqpChannel, WatchedChannel>();

  constructor(
    private readonly reflector: Reflector,
    private readonly db: Database,
    private readonly metrics: IdempotencyMetrics,
    @Optional() @Inject(IDEMPOTENT_MESSAGE_DEFAULTS) private readonly defaults?: IdempotentMessageDefaults,
  ) {}

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    const options = this.reflector.get<ResolvedMessageOptions>(IDEMPOTENT_MESSAGE, context.getHandler());
    const rpc = context.switchToRpc();
    const broker = rpc.getContext<BrokerMessageContext>();
    return from(this.handle(options, rpc.getData(), broker.getMessage() as AmqpMessage, broker.getChannelRef() as AmqpChannel, next));
  }

  private handle(
    options: ResolvedMessageOptions,
    data: unknown,
    message: AmqpMessage,
    channel: AmqpChannel,
    next: CallHandler,
  ): Promise<void> {
    const { consumer } = options;
    const messageId = options.key(data, message);
    const attempt = deliveryAttempt(message);
    if (!messageId) {
      // Without an identity a redelivery could not be told from a new message: refused, never applied unguarded.
      this.settle(channel, message, 'dead-lettered', consumer, { attempt }, 'a message without an id cannot be deduplicated');
      return Promise.resolve();
    }
    this.watch(channel);
    return new Promise<void>((done) => {
      const delivery: Delivery = { options, messageId, attempt, message, channel, next, done };
      const batch = options.batch ?? this.defaults?.batch;
      if (batch && batch.size > 1 && messageId.length <= MAX_MESSAGE_ID_LENGTH) this.enqueue(delivery, batch);
      else void this.handleOne(delivery);
    });
  }

  /** One delivery, one transaction: the claim, the handler's effect, COMMIT, then the ack. */
  private async handleOne(delivery: Delivery): Promise<void> {
    const { options, messageId, attempt, message, channel, next } = delivery;
    const { consumer, table } = options;
    try {
      const applied = await this.whileNotTheMessages(delivery, () =>
        this.db.transaction(async () => {
          // The claim first: a concurrent delivery of the same id waits here for this transaction, then sees the mark.
          const claimed = await this.db.query(claimMessageStatement(table), [consumer, messageId]);
          if (claimed.length === 0) return false;
          await lastValueFrom(next.handle(), { defaultValue: undefined });
          return true;
        }),
      );
      if (applied === DROPPED) {
        // Its channel closed while it was held: the broker has it back and delivers it again; nothing was committed.
        this.logger.warn(
          `the channel closed while the message was held: dropped, the broker delivers it again (${described({ consumer, messageId, attempt })})`,
        );
        this.metrics.noteMessage(consumer, 'dropped');
        return;
      }
      // Only now, after COMMIT: a crash before this line redelivers the message, which then finds its mark.
      this.settle(channel, message, applied ? 'applied' : 'duplicate', consumer, { messageId, attempt });
    } catch (err) {
      this.settleFailure(delivery, err);
    } finally {
      delivery.done();
    }
  }

  private settleFailure(delivery: Delivery, err: unknown): void {
    const { options, messageId, attempt, message, channel } = delivery;
    const last = attempt >= (options.maxAttempts ?? this.defaults?.maxAttempts ?? 5);
    this.settle(
      channel,
      message,
      last ? 'dead-lettered' : 'retried',
      options.consumer,
      { messageId, attempt, err },
      last ? `failed ${attempt} times` : 'failed, sent back',
    );
  }

  /** Batches wait here per marks' table and consumer (one claim statement serves a batch). */
  private readonly gathering = new Map<string, { deliveries: Delivery[]; timer?: NodeJS.Timeout }>();

  private enqueue(delivery: Delivery, batch: MessageBatching): void {
    const group = `${delivery.options.table} ${delivery.options.consumer}`;
    let gathered = this.gathering.get(group);
    if (!gathered) this.gathering.set(group, (gathered = { deliveries: [] }));
    gathered.deliveries.push(delivery);
    if (gathered.deliveries.length >= Math.min(batch.size, MAX_BATCH_SIZE)) this.startBatch(group, batch);
    else gathered.timer ??= setTimeout(() => this.startBatch(group, batch), batch.waitMs);
  }

  /** Takes up to `size` gathered deliveries with distinct ids (a second copy of an id waits for the next batch) and runs them. */
  private startBatch(group: string, batch: MessageBatching): void {
    const gathered = this.gathering.get(group);
    if (!gathered) return;
    clearTimeout(gathered.timer);
    gathered.timer = undefined;
    const ids = new Set<string>();
    const taken: Delivery[] = [];
    const left: Delivery[] = [];
    for (const delivery of gathered.deliveries) {
      if (taken.length < Math.min(batch.size, MAX_BATCH_SIZE) && !ids.has(delivery.messageId)) {
        ids.add(delivery.messageId);
        taken.push(delivery);
      } else left.push(delivery);
    }
    gathered.deliveries = left;
    if (left.length) gathered.timer = setTimeout(() => this.startBatch(group, batch), batch.waitMs);
    else this.gathering.delete(group);
    void (taken.length === 1 ? this.handleOne(taken[0]) : this.handleBatch(taken));
  }

  /**
   * A group commit: ONE transaction claims every mark of the batch in one statement, then applies each claimed
   * message under a savepoint of its own (a message that fails rolls back only itself, and its mark with it), and
   * COMMITs; only then is each delivery acked (or nacked, for those that failed). If the transaction fails as a
   * whole (the database away, a deadlock lost, the COMMIT refused), nothing of it is settled: each delivery is run
   * again in a transaction of its own, so one message can never hold the others back.
   */
  private async handleBatch(deliveries: Delivery[]): Promise<void> {
    deliveries.sort((a, b) => (a.messageId < b.messageId ? -1 : a.messageId > b.messageId ? 1 : 0));
    const { consumer, table } = deliveries[0].options;
    let results: BatchResult[];
    try {
      results = await this.db.transaction(async () => {
        const claimed = new Set(
          (await this.db.query<{ message_id: string }>(claimMessagesStatement(table), [consumer, deliveries.map((d) => d.messageId)])).map(
            (r) => r.message_id,
          ),
        );
        const out: BatchResult[] = [];
        for (const [i, delivery] of deliveries.entries()) {
          if (!claimed.has(delivery.messageId)) {
            out.push({ applied: false });
            continue;
          }
          await this.db.savepoint(`message_${i}`);
          try {
            await lastValueFrom(delivery.next.handle(), { defaultValue: undefined });
            await this.db.query(`RELEASE SAVEPOINT message_${i}`);
            out.push({ applied: true });
          } catch (err) {
            if (notTheMessages(err)) throw err;
            // The message's own failure: its effect undone, and its mark, so that its retry can claim it again.
            await this.db.rollbackToSavepoint(`message_${i}`);
            await this.db.query(`DELETE FROM ${table} WHERE consumer = $1 AND message_id = $2`, [consumer, delivery.messageId]);
            out.push({ err });
          }
        }
        return out;
      });
    } catch (err) {
      this.logger.warn(
        `a batch failed as a whole; its messages are tried again one by one (${described({ consumer, messages: deliveries.length, err })})`,
      );
      await Promise.all(deliveries.map((delivery) => this.handleOne(delivery)));
      return;
    }
    this.defaults?.afterBatchCommit?.(deliveries.map((d) => d.messageId));
    // Only now, after COMMIT: each delivery acked on its own (never `allUpTo`: a delivery tag below these may belong
    // to a message still held in another batch, whose ack must wait for its own COMMIT).
    for (const [i, delivery] of deliveries.entries()) {
      const result = results[i];
      if ('err' in result) this.settleFailure(delivery, result.err);
      else
        this.settle(delivery.channel, delivery.message, result.applied ? 'applied' : 'duplicate', consumer, {
          messageId: delivery.messageId,
          attempt: delivery.attempt,
        });
      delivery.done();
    }
  }

  /**
   * Runs the transaction again, holding the delivery (unacked: the prefetch bounds how many are held), while the
   * database is unreachable, refuses connections or has none free: those say nothing about the message, so they must
   * not use up its attempts and dead-letter good messages during an outage. A lock timeout, deadlock, serialization
   * failure or cancelled statement is tried CONTENDED_TRIES_PER_DELIVERY times, then thrown as the message's failure
   * (counted by the broker's delivery count). Any other error is the message's at once. A delivery whose channel
   * closes while it is held is DROPPED: the broker has taken it back, and holding it on would only pile up a
   * prefetch's worth of dead deliveries per broker flap.
   */
  private async whileNotTheMessages<T>(delivery: Delivery, run: () => Promise<T>): Promise<T | typeof DROPPED> {
    const { consumer } = delivery.options;
    const watched = this.watch(delivery.channel);
    let contended = 0;
    let held = false;
    try {
      for (let wait = HOLD_FIRST_MS; ; wait = Math.min(wait * 2, HOLD_MAX_MS)) {
        try {
          return await run();
        } catch (err) {
          const unavailable = databaseUnavailable(err);
          if (!unavailable && !(isContention(err) && ++contended < CONTENDED_TRIES_PER_DELIVERY)) throw err;
          if (watched.closed) return DROPPED;
          if (!held) this.metrics.held.inc({ consumer });
          held = true;
          const fields = { consumer, messageId: delivery.messageId, err, retryInMs: wait };
          if (unavailable) this.logger.warn(`database unavailable: the message is held and tried again (${described(fields)})`);
          else
            this.logger.warn(
              `the message met a lock, deadlock or cancel (try ${contended} of ${CONTENDED_TRIES_PER_DELIVERY}): tried again (${described(fields)})`,
            );
          await this.pause(wait, watched);
          if (watched.closed) return DROPPED;
        }
      }
    } finally {
      if (held) this.metrics.held.dec({ consumer });
    }
  }

  /** The channel's watch, set up the first time a delivery of it is seen. */
  private watch(channel: AmqpChannel): WatchedChannel {
    let watched = this.channels.get(channel);
    if (!watched) {
      const created: WatchedChannel = { closed: false, wake: new Set() };
      channel.once?.('close', () => {
        created.closed = true;
        for (const wake of created.wake) wake();
      });
      this.channels.set(channel, (watched = created));
    }
    return watched;
  }

  /** Waits `ms`, or less if the channel closes meanwhile. */
  private async pause(ms: number, watched: WatchedChannel): Promise<void> {
    let wake!: () => void;
    const woken = new Promise<void>((resolve) => (wake = resolve));
    const timer = setTimeout(wake, ms);
    watched.wake.add(wake);
    try {
      await woken;
    } finally {
      clearTimeout(timer);
      watched.wake.delete(wake);
    }
  }

  private settle(
    channel: AmqpChannel,
    message: AmqpMessage,
    outcome: MessageOutcome,
    consumer: string,
    fields: Record<string, unknown>,
    why?: string,
  ): void {
    try {
      if (outcome === 'applied' || outcome === 'duplicate') channel.ack(message);
      else channel.nack(message, false, outcome === 'retried');
    } catch (err) {
      // The channel closed under us (a broker restart): the broker redelivers the message, and the mark decides again.
      this.logger.warn(
        `could not settle the message; the broker will deliver it again (${described({ consumer, ...fields, outcome, err })})`,
      );
      return;
    }
    this.metrics.noteMessage(consumer, outcome);
    const about = described({ consumer, ...fields });
    if (outcome === 'dead-lettered') this.logger.error(`message dead-lettered: ${why} (${about})`);
    else if (outcome === 'retried') this.logger.warn(`message ${why} (${about})`);
    else if (Logger.isLevelEnabled('debug')) this.logger.debug(`message ${outcome} (${about})`);
  }
}

/**
 * Makes an `@EventPattern` handler apply each message once: the handler writes through `Database` (`query`,
 * `manager`, `getRepository`) to commit with the mark. The transport must run with `noAck: false`: this layer acks.
 */
export function IdempotentMessage(options: IdempotentMessageOptions) {
  const table = options.table ?? 'processed_messages';
  if (!IDENTIFIER.test(table)) throw new Error(`IdempotentMessage: table must be a plain identifier (schema.table), got ${table}`);
  if (!options.consumer) throw new Error('IdempotentMessage: consumer is required');
  const resolved: ResolvedMessageOptions = {
    consumer: options.consumer,
    table,
    key: options.key ?? ((_data, message) => message.properties.messageId || undefined),
    maxAttempts: options.maxAttempts,
    batch: options.batch,
  };
  return applyDecorators(SetMetadata(IDEMPOTENT_MESSAGE, resolved), UseInterceptors(IdempotentMessageInterceptor));
}

/** The marks' table, for the app's migration. Keyed by (consumer, message id): that pair is applied once. */
export async function createProcessedMessagesTable(queryRunner: QueryRunner, table = 'processed_messages'): Promise<void> {
  const name = table.split('.').pop();
  await queryRunner.query(`
    CREATE TABLE ${table} (
      consumer text NOT NULL,
      message_id text NOT NULL CHECK (length(message_id) BETWEEN 1 AND 255),
      processed_at timestamptz NOT NULL DEFAULT now(),
      -- The duplicate it prevents: a redelivered or republished message applied a second time by the same consumer.
      CONSTRAINT pk_${name} PRIMARY KEY (consumer, message_id)
    )`);
  // The reaper's range scan.
  await queryRunner.query(`CREATE INDEX ix_${name}_processed_at ON ${table} (processed_at)`);
}

/**
 * Deletes marks older than `retentionSeconds`, in batches; returns how many. Run it with a retention longer than
 * any redelivery can come late (see docs/patterns/message-consumer.md): a mark reaped earlier lets a late
 * duplicate through to the handler, where only the effect's own business key still stops it.
 */
export function reapProcessedMessages(db: Database, retentionSeconds: number, table = 'processed_messages'): Promise<number> {
  if (!IDENTIFIER.test(table)) throw new Error(`reapProcessedMessages: table must be a plain identifier, got ${table}`);
  return deleteInBatches(async (size) => {
    const rows = await db.query(
      `DELETE FROM ${table} WHERE ctid IN (SELECT ctid FROM ${table} WHERE processed_at < now() - make_interval(secs => $1) LIMIT $2) RETURNING 1`,
      [retentionSeconds, size],
    );
    return rows.length;
  });
}
