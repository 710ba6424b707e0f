import { Injectable, Logger } from '@nestjs/common';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { Database } from '@idempotent-orders/idempotency';

/**
 * - confirmed: the broker confirmed the publish (the row is then marked sent);
 * - failed: it nacked, timed out or the connection dropped first (the row is due again).
 */
export type PublishResult = 'confirmed' | 'failed';

/** What the order events relay reports in /metrics. Backlog and lag are read from the table at scrape time: every instance writes it. */
@Injectable()
export class OrderEventsMetrics {
  private readonly logger = new Logger('OrderEventsRelay');
  readonly published: Counter<'result'>;
  readonly lag: Histogram;

  constructor(db: Database, registry: Registry) {
    const registers = [registry];
    this.published = new Counter({
      name: 'order_events_published_total',
      help: 'Order event publishes to RabbitMQ by result: confirmed by the broker, or failed (nack, confirm timeout, connection lost)',
      labelNames: ['result'],
      registers,
    });
    // Zero rather than absent before the first publish, so rate() and alerts see the series.
    for (const result of ['confirmed', 'failed'] satisfies PublishResult[]) this.published.inc({ result }, 0);
    this.lag = new Histogram({
      name: 'order_events_publish_lag_seconds',
      help: 'From the change that wrote an order event to the broker confirming its publish',
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300],
      registers,
    });
    const logger = this.logger;
    let backlog: Promise<{ pending: number; oldest_age: number | null }> | undefined;
    // One query per scrape for both gauges.
    const read = () =>
      (backlog ??= db
        .query<{ pending: number; oldest_age: number | null }>(
          `SELECT count(*)::int AS pending, extract(epoch FROM now() - min(created_at))::float8 AS oldest_age
             FROM order_events_outbox WHERE sent_at IS NULL`,
        )
        .then(([row]) => row)
        .finally(() => setImmediate(() => (backlog = undefined))));
    const scraped = (set: (row: { pending: number; oldest_age: number | null }) => void) =>
      read()
        .then(set)
        // A scrape must not fail because the database hiccuped: the previous value stays.
        .catch((err: unknown) =>
          logger.warn({ err: err instanceof Error ? err.message : String(err) }, 'order events outbox backlog could not be read'),
        );
    new Gauge({
      name: 'order_events_outbox_pending',
      help: 'Order events not yet confirmed by the broker, across all instances, counted at scrape time',
      registers,
      async collect() {
        await scraped((row) => this.set(row.pending));
      },
    });
    new Gauge({
      name: 'order_events_outbox_lag_seconds',
      help: 'Age of the oldest order event not yet confirmed by the broker (0 when none waits), at scrape time',
      registers,
      async collect() {
        await scraped((row) => this.set(row.oldest_age ?? 0));
      },
    });
  }
}
