import { Injectable, Logger } from '@nestjs/common';
import { Interval } from '@nestjs/schedule';
import { deleteInBatches } from '../database/delete-in-batches.js';
import { IdempotencyKeysService } from './idempotency-keys.service.js';

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
    const total = await deleteInBatches((size) => this.keys.reapExpiredKeys(size));
    if (total) this.logger.log({ deleted: total }, 'reaped expired idempotency keys');
    return total;
  }
}
