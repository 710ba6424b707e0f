import { Logger } from '@nestjs/common';
import { type RmqOptions, ServerRMQ } from '@nestjs/microservices';
import type { AmqpConnectionManager } from 'amqp-connection-manager';
import type { Channel, ConsumeMessage } from 'amqplib';
import type { BrokerStatus } from './broker-status.js';

/** How long after a lost consumer the connection is opened again: a refusal repeated at once would only spin. */
const RESUME_DELAY_MS = 1_000;

/**
 * Nest's RMQ server, with its consumer awaited and watched (a strategy Nest takes as is: `connectMicroservice({ strategy })`).
 *
 * Nest's own `setupChannel` does not await `channel.consume`, and amqp-connection-manager sets a channel up again only
 * when the CONNECTION comes back. So a consumer the broker refuses or drops while the connection stays up — a
 * `basic.consume` answered with a channel error while a queue recovers after a crash, a `basic.cancel` — left the
 * process connected, healthy by its connection, and consuming nothing (found by a broker-restart test); a refusal
 * arriving later became an unhandled rejection that killed it. Here every step is awaited, the channel's close and
 * the broker's cancel are watched, and a lost consumer opens the connection again (which sets the channel up anew);
 * `BrokerStatus.consuming` says whether this process holds a consumer, for /health.
 */
export class OrderEventsServer extends ServerRMQ {
  private readonly log = new Logger('OrderEventsConsumer');
  private stopping = false;
  private resumeTimer: NodeJS.Timeout | undefined;
  /** The channel set up last: a late close or cancel of an earlier one must not undo it. */
  private current: Channel | undefined;

  constructor(
    private readonly rmq: Required<RmqOptions>['options'],
    private readonly brokerStatus: BrokerStatus,
  ) {
    super(rmq);
  }

  override async setupChannel(channel: Channel, callback: () => void): Promise<void> {
    // A new channel: the connection came back by itself, so a resume still waiting would only cut it again.
    clearTimeout(this.resumeTimer);
    this.resumeTimer = undefined;
    this.brokerStatus.consuming = false;
    this.current = channel;
    channel.once('close', () => this.lose(channel, 'its channel closed'));
    try {
      const { queue } = await channel.assertQueue(this.queue, this.queueOptions as Record<string, unknown>);
      await channel.assertExchange(this.rmq.exchange!, this.rmq.exchangeType ?? 'topic', { durable: true });
      await channel.bindQueue(queue, this.rmq.exchange!, this.rmq.routingKey!);
      await channel.prefetch(this.rmq.prefetchCount!);
      await channel.consume(
        queue,
        (message: ConsumeMessage | null) => {
          // null: the broker cancelled this consumer (the queue deleted, or moved away): consuming again needs a new one.
          if (message === null) return this.lose(channel, 'the broker cancelled it');
          this.handleMessage(message, channel).catch((err: unknown) => this.handleError(String(err)));
        },
        { noAck: this.noAck },
      );
    } catch (err) {
      // The channel is closed by now (every AMQP refusal closes it) or about to be: `lose` takes it from here. Never
      // thrown on: amqp-connection-manager re-emits a setup's error as an 'error' event nobody listens to.
      this.log.warn(`cannot consume ${this.queue}: ${(err as Error).message}`);
      this.lose(channel, 'setting it up failed');
      return;
    }
    this.brokerStatus.consuming = true;
    this.log.log(`consuming ${this.queue}`);
    callback();
  }

  override async close(): Promise<void> {
    this.stopping = true;
    clearTimeout(this.resumeTimer);
    this.brokerStatus.consuming = false;
    await super.close();
  }

  /** The consumer is gone while the process runs: open the connection again (once, after a pause), unless stopping. */
  private lose(channel: Channel, why: string): void {
    if (channel !== this.current) return;
    const wasConsuming = this.brokerStatus.consuming;
    this.brokerStatus.consuming = false;
    if (this.stopping || this.resumeTimer) return;
    if (wasConsuming) this.log.warn(`consumer of ${this.queue} lost (${why}): connecting again`);
    this.resumeTimer = setTimeout(() => {
      this.resumeTimer = undefined;
      // While disconnected, amqp-connection-manager's own reconnect runs the setup again: nothing to do here.
      // Nest types its connection manager as `any`; it is amqp-connection-manager's.
      const connection = this.server as AmqpConnectionManager | null;
      if (!this.stopping && connection?.isConnected()) connection.reconnect();
    }, RESUME_DELAY_MS);
    this.resumeTimer.unref();
  }
}
