import { Inject, Injectable, Logger, type OnApplicationBootstrap, type OnApplicationShutdown } from '@nestjs/common';
import { deleteInBatches } from './delete-in-batches.js';
import { IDEMPOTENCY_OPTIONS, type ResolvedIdempotencyOptions } from './idempotency-options.js';
import { IdempotencyKeysService } from './idempotency-keys.service.js';

// Expired keys already count as absent to requests; reaping only bounds the table, so once a minute is plenty.
const REAP_INTERVAL_MS = 60_000;

/**
 * Deletes expired keys on a timer of its own, not @nestjs/schedule's @Interval: that one runs only in an
 * app that imports ScheduleModule, and a layer must not ask that of the app it is lifted into.
 */
@Injectable()
export class IdempotencyKeyReaper implements OnApplicationBootstrap, OnApplicationShutdown {
  private readonly logger = new Logger('IdempotencyKeyReaper');
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly keys: IdempotencyKeysService,
    @Inject(IDEMPOTENCY_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
  ) {}

  onApplicationBootstrap(): void {
    if (!this.options.reaper) return;
    this.timer = setInterval(() => void this.reapOnSchedule(), REAP_INTERVAL_MS);
    // A pending reap never keeps the process alive.
    this.timer.unref();
  }

  onApplicationShutdown(): void {
    clearInterval(this.timer);
  }

  async reapOnSchedule(): Promise<void> {
    try {
      await this.reapExpiredKeys();
    } catch (err) {
      this.logger.error(
        `reaping expired idempotency keys failed; will retry next tick: ${String(err)}`,
        err instanceof Error ? err.stack : undefined,
      );
    }
  }

  /** Deletes expired keys batch by batch; returns how many. */
  async reapExpiredKeys(): Promise<number> {
    const total = await deleteInBatches((size) => this.keys.reapExpiredKeys(size));
    if (total) this.logger.log(`reaped ${total} expired idempotency keys`);
    return total;
  }
}
