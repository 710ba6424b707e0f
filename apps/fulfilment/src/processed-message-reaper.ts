import { Inject, Injectable, Logger, type OnApplicationBootstrap, type OnApplicationShutdown } from '@nestjs/common';
import { Database } from '@idempotent-orders/idempotency';
import { reapProcessedMessages } from '@idempotent-orders/idempotency/messages';
import { FULFILMENT_CONFIG } from './fulfilment.module-tokens.js';
import type { FulfilmentConfig } from './config.js';

// Marks live for days; a reap every ten minutes keeps each run's batches small. Instances may reap at once: a DELETE
// of rows another instance already deleted deletes nothing, so no lock is needed.
const REAP_INTERVAL_MS = 10 * 60_000;

/** Deletes dedupe marks older than FULFILMENT_MARK_RETENTION_HOURS, in batches. */
@Injectable()
export class ProcessedMessageReaper implements OnApplicationBootstrap, OnApplicationShutdown {
  private readonly logger = new Logger('ProcessedMessageReaper');
  private timer: NodeJS.Timeout | undefined;
  private running = false;

  constructor(
    private readonly db: Database,
    @Inject(FULFILMENT_CONFIG) private readonly config: FulfilmentConfig,
  ) {}

  onApplicationBootstrap(): void {
    // Once at start too: an instance restarted more often than the interval still reaps.
    void this.reapOnSchedule();
    this.timer = setInterval(() => void this.reapOnSchedule(), REAP_INTERVAL_MS);
    this.timer.unref();
  }

  onApplicationShutdown(): void {
    clearInterval(this.timer);
  }

  async reapOnSchedule(): Promise<void> {
    // Runs must not overlap: a slow one would otherwise be joined by the next tick's.
    if (this.running) return;
    this.running = true;
    try {
      const deleted = await this.reap();
      if (deleted) this.logger.log({ deleted }, 'reaped old dedupe marks');
    } catch (err) {
      this.logger.error({ err }, 'reaping dedupe marks failed; will retry next tick');
    } finally {
      this.running = false;
    }
  }

  reap(): Promise<number> {
    return reapProcessedMessages(this.db, this.config.markRetentionHours * 3600, 'fulfilment.processed_messages');
  }
}
