import type { RmqOptions } from '@nestjs/microservices';
import type { ConsumeMessage } from 'amqplib';
import { connect } from 'amqplib';
import type { FulfilmentConfig } from './config.js';

/** The names both sides agree on (docs/patterns/message-consumer.md#the-message-contract). */
export const ORDERS_EXCHANGE = 'orders.events';
export const ORDER_EVENTS_QUEUE = 'fulfilment.order-events';
export const DEAD_LETTER_EXCHANGE = 'fulfilment.dlx';
/**
 * A quorum queue, like the consumer's: a classic queue lives on the one node it was declared on, and while that node is
 * away nothing dead-lettered reaches it and the consumer cannot start (its declaration is refused: 404, home node
 * down). Named anew because a queue's type cannot change: an older deployment's classic `fulfilment.order-events.dead`
 * stays bound to the exchange until drained and deleted (docs/patterns/message-consumer.md).
 */
export const DEAD_LETTER_QUEUE = 'fulfilment.order-events.dead-letters';

/**
 * Nest's RMQ transport expects `{ pattern, data }` bodies; the order service publishes the bare event with its type
 * in the AMQP `type` property (which is also the routing key). A body that is not JSON reaches the handler as a
 * string and is refused there, so it goes through the same retry and dead-letter path as any failure.
 */
export class OrderEventDeserializer {
  deserialize(value: unknown, options?: ConsumeMessage['properties']): { pattern: string; data: unknown } {
    const fromBody = typeof value === 'object' && value !== null ? (value as { type?: unknown }).type : undefined;
    const type: unknown = options?.type ?? fromBody;
    // Never undefined: Nest nacks (without requeue: dead-letters) a pattern it has no handler for.
    return { pattern: typeof type === 'string' && type ? type : 'unknown', data: value };
  }
}

/**
 * A connection attempt's limit, handshake included: a frozen node (SIGSTOP, a suspended VM) accepts TCP in its kernel and
 * never answers, and amqplib waits for it forever unless told; given up, the next node of AMQP_URL is tried.
 */
export const CONNECT_TIMEOUT_MS = 5_000;

/**
 * The queue's own limit on deliveries, fixed: a queue's arguments cannot change once it exists (a different value
 * makes every later assertQueue fail with PRECONDITION_FAILED), so it is not the configurable
 * FULFILMENT_MAX_ATTEMPTS, which the handler applies first and which config caps below this.
 */
export const DELIVERY_LIMIT_BACKSTOP = 20;

/**
 * The consumer's queue: a QUORUM queue, because it counts deliveries itself (`x-delivery-count`, kept across
 * consumer crashes and restarts) and stops a message after `x-delivery-limit` returns — a backstop for a message
 * that kills the process before the handler can dead-letter it. Failures go to the dead-letter exchange.
 */
export function rmqOptions(config: FulfilmentConfig): Required<RmqOptions>['options'] {
  return {
    urls: config.amqpUrls,
    queue: ORDER_EVENTS_QUEUE,
    queueOptions: {
      durable: true,
      arguments: {
        'x-queue-type': 'quorum',
        'x-dead-letter-exchange': DEAD_LETTER_EXCHANGE,
        'x-delivery-limit': DELIVERY_LIMIT_BACKSTOP,
      },
    },
    // The handler's layer acks, after its COMMIT (@IdempotentMessage); never the transport on delivery.
    noAck: false,
    prefetchCount: config.prefetch,
    exchange: ORDERS_EXCHANGE,
    exchangeType: 'topic',
    routingKey: 'order.*',
    deserializer: new OrderEventDeserializer(),
    socketOptions: { heartbeatIntervalInSeconds: 5, reconnectTimeInSeconds: 1, connectionOptions: { timeout: CONNECT_TIMEOUT_MS } },
  };
}

/** The first of a cluster's nodes that accepts a connection (a node down at start-up is skipped). */
async function connectToAny(urls: string[]) {
  let lastError: unknown;
  for (const url of urls) {
    try {
      return await connect(url, { timeout: CONNECT_TIMEOUT_MS });
    } catch (err) {
      lastError = err;
    }
  }
  throw lastError;
}

/**
 * The dead-letter exchange and queue, asserted before consuming starts: Nest's transport asserts only the main
 * queue, and a message dead-lettered to an exchange with no queue bound would be dropped. Idempotent.
 */
export async function assertDeadLetterTopology(amqpUrls: string[]): Promise<void> {
  const connection = await connectToAny(amqpUrls);
  try {
    const channel = await connection.createChannel();
    await channel.assertExchange(DEAD_LETTER_EXCHANGE, 'fanout', { durable: true });
    await channel.assertQueue(DEAD_LETTER_QUEUE, { durable: true, arguments: { 'x-queue-type': 'quorum' } });
    await channel.bindQueue(DEAD_LETTER_QUEUE, DEAD_LETTER_EXCHANGE, '');
    await channel.close();
  } finally {
    await connection.close();
  }
}
