import { type DynamicModule, Module } from '@nestjs/common';
import { OrderEventsMetrics } from './order-events-metrics.js';
import { ORDER_EVENTS_DATABASE_URL, OrderEventsRelay } from './order-events-relay.js';

/** The order events' relay (off without AMQP_URL) and its metrics. The outbox rows themselves are written by OrdersService. */
@Module({})
export class OrderEventsModule {
  static forRoot({ databaseUrl }: { databaseUrl: string }): DynamicModule {
    return {
      module: OrderEventsModule,
      providers: [OrderEventsMetrics, OrderEventsRelay, { provide: ORDER_EVENTS_DATABASE_URL, useValue: databaseUrl }],
      exports: [OrderEventsRelay],
      global: true,
    };
  }
}
