import { Injectable, Logger } from '@nestjs/common';
import { Interval } from '@nestjs/schedule';
import { IdempotencyKeysService } from './idempotency-keys.service.js';

// Small batches keep each DELETE's locks and WAL short; a few per tick keep up with ~1000 keys/s.
const REAP_BATCH_SIZE = 500;
const REAP_MAX_BATCHES_PER_TICK = 20;
// Expired keys already count as absent to requests; reaping only bounds the table, so once a minute is plenty.
const REAP_INTERVAL_MS = 60_000;

@Injectable()
export class IdempotencyKeyReaper {
  private readonly logger = new Logger('IdempotencyKeyReaper');

  constructor(private readonly keys: IdempotencyKeysService) {}

  @Interval(REAP_INTERVAL_MS)
  async reapOnSchedule(): Promise<void> {
    try {
      await this.reapExpiredKeys();
    } catch (err) {
      this.logger.error({ err }, 'reaping expired idempotency keys failed; will retry next tick');
    }
  }

  /** Deletes expired keys batch by batch; returns how many. */
  async reapExpiredKeys(): Promise<number> {
    let total = 0;
    for (let batch = 0; batch < REAP_MAX_BATCHES_PER_TICK; batch++) {
      const deleted = await this.keys.reapExpiredKeys(REAP_BATCH_SIZE);
      total += deleted;
      if (deleted < REAP_BATCH_SIZE) break;
    }
    if (total) this.logger.log({ deleted: total }, 'reaped expired idempotency keys');
    return total;
  }
}
