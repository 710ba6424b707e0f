/**
 * A small publisher that follows the message contract of the order service's relay (persistent, publisher confirms,
 * `messageId` = event id, `type` = routing key, JSON camelCase): what the fulfilment consumer receives in production.
 */
import { randomUUID } from 'node:crypto';
import { type ChannelModel, type ConfirmChannel, connect } from 'amqplib';
import type { OrderEvent } from '../../apps/fulfilment/src/order-event';

/** What the consumer parses (apps/fulfilment's OrderEvent): the publisher sends exactly that shape. */
export type TestOrderEvent = OrderEvent;

export const orderEvent = (type: TestOrderEvent['type'], orderId: string, orderVersion: number): TestOrderEvent => ({
  eventId: randomUUID(),
  type,
  orderId,
  clientId: 'alice',
  orderVersion,
  totalMinor: 4_200,
  currency: 'EUR',
  occurredAt: new Date().toISOString(),
});

export interface OrderEventsPublisher {
  publish(event: TestOrderEvent): void;
  /** A body of any bytes under a type and message id of the caller's choosing (a poison message). */
  publishRaw(type: string, messageId: string, body: Buffer): void;
  /** Resolves once the broker has confirmed everything published so far. */
  confirmed(): Promise<void>;
  close(): Promise<void>;
}

export async function orderEventsPublisher(url: string): Promise<OrderEventsPublisher> {
  const connection: ChannelModel = await connect(url);
  // A test that cuts connections (the harness's closeAllConnections) makes amqplib emit 'error': expected, not a crash.
  connection.on('error', () => undefined);
  const channel: ConfirmChannel = await connection.createConfirmChannel();
  channel.on('error', () => undefined);
  await channel.assertExchange('orders.events', 'topic', { durable: true });
  const send = (type: string, messageId: string, body: Buffer) =>
    channel.publish('orders.events', type, body, {
      persistent: true,
      contentType: 'application/json',
      messageId,
      type,
      timestamp: Math.floor(Date.now() / 1000),
    });
  return {
    publish: (event) => send(event.type, event.eventId, Buffer.from(JSON.stringify(event))),
    publishRaw: send,
    confirmed: () => channel.waitForConfirms(),
    close: async () => {
      await channel.close().catch(() => undefined);
      await connection.close().catch(() => undefined);
    },
  };
}
