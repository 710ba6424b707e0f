import { Injectable, Logger } from '@nestjs/common';
import { Interval } from '@nestjs/schedule';
import { Database } from '@idempotent-orders/idempotency';
import { deleteInBatches } from '#service-kit';

/**
 * How long a processed event is remembered. Standard Webhooks providers stop redelivering after a
 * few days; a month is far past that. Beyond it a stray redelivery would still change nothing: the
 * effects themselves are conditional UPDATEs, and a late charge has one refund row per charge.
 */
export const PROCESSED_EVENT_RETENTION_DAYS = 30;
// Reaping only bounds the table, so once an hour is plenty.
const REAP_INTERVAL_MS = 3_600_000;

@Injectable()
export class ProcessedWebhookEventReaper {
  private readonly logger = new Logger('ProcessedWebhookEventReaper');

  constructor(private readonly db: Database) {}

  @Interval(REAP_INTERVAL_MS)
  async reapOnSchedule(): Promise<void> {
    try {
      await this.reapOldEvents();
    } catch (err) {
      this.logger.error({ err }, 'reaping processed webhook events failed; will retry next tick');
    }
  }

  /** Deletes events older than the retention, batch by batch (SKIP LOCKED: N instances share the work); returns how many. */
  async reapOldEvents(): Promise<number> {
    const total = await deleteInBatches(async (size) => {
      const rows = await this.db.query(
        `DELETE FROM processed_webhook_events
          WHERE webhook_id IN (SELECT webhook_id FROM processed_webhook_events
                                WHERE received_at < now() - make_interval(days => $1)
                                ORDER BY received_at LIMIT $2 FOR UPDATE SKIP LOCKED)
         RETURNING 1`,
        [PROCESSED_EVENT_RETENTION_DAYS, size],
      );
      return rows.length;
    });
    if (total) this.logger.log({ deleted: total }, 'reaped processed webhook events');
    return total;
  }
}
