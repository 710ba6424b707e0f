import { Injectable, Logger, Optional } from '@nestjs/common';
import { Counter, Gauge, Registry } from 'prom-client';
import { SandboxDatabase } from './sandbox-database.js';

/**
 * - delivered: the receiver answered 2xx (the row is done);
 * - rejected: it answered something else (3xx included: a webhook endpoint does not redirect);
 * - unreachable: no answer (refused, reset, timed out).
 */
export type WebhookDeliveryResult = 'delivered' | 'rejected' | 'unreachable';

/**
 * What the sandbox's webhook relay reports in /metrics (the app's registry; a private one under `npm run psp`, which serves no /metrics).
 */
@Injectable()
export class WebhookMetrics {
  private readonly logger = new Logger('PspWebhookRelay');
  readonly deliveries: Counter<'result'>;
  readonly pending: Gauge;

  constructor(db: SandboxDatabase, @Optional() registry?: Registry) {
    const registers = [registry ?? new Registry()];
    this.deliveries = new Counter({
      name: 'psp_webhook_deliveries_total',
      help: 'Webhook delivery attempts of the sandbox provider by result: delivered (2xx), rejected (any other status), unreachable (network error or timeout)',
      labelNames: ['result'],
      registers,
    });
    // Zero rather than absent before the first attempt, so rate() and alerts see the series.
    for (const result of ['delivered', 'rejected', 'unreachable'] satisfies WebhookDeliveryResult[]) this.deliveries.inc({ result }, 0);
    const logger = this.logger;
    this.pending = new Gauge({
      name: 'psp_webhook_outbox_pending',
      help: 'Undelivered webhook events (copies) in the sandbox outbox, across all instances, counted at scrape time',
      registers,
      // At scrape time: the table is the truth (every instance writes to it), not this process's memory.
      async collect() {
        try {
          const [{ n }] = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM psp.webhook_outbox WHERE delivered_at IS NULL`);
          this.set(n);
        } catch (err) {
          // A scrape must not fail because the database hiccuped: the previous value stays.
          logger.warn({ err: err instanceof Error ? err.message : String(err) }, 'psp webhook outbox backlog could not be counted');
        }
      },
    });
  }
}
