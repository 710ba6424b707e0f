import { Global, Module } from '@nestjs/common';
import { OrderEventsMetrics } from './order-events-metrics.js';
import { OrderEventsRelay } from './order-events-relay.js';

/** The order events' relay (off without AMQP_URL) and its metrics. The outbox rows themselves are written by OrdersService. */
@Global()
@Module({ providers: [OrderEventsMetrics, OrderEventsRelay], exports: [OrderEventsRelay] })
export class OrderEventsModule {}
