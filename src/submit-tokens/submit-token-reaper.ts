import { Injectable, Logger } from '@nestjs/common';
import { Interval } from '@nestjs/schedule';
import { deleteInBatches } from '#service-kit';
import { SubmitTokensService } from './submit-tokens.service.js';

// Expired tokens are already refused; reaping only bounds the table, so once a minute is plenty.
const REAP_INTERVAL_MS = 60_000;

/**
 * Deletes tokens a day after they expire, not at once: for that day a late retry with a used
 * token still gets 409 naming its order, rather than 422 for a token we no longer know.
 */
@Injectable()
export class SubmitTokenReaper {
  private readonly logger = new Logger('SubmitTokenReaper');

  constructor(private readonly submitTokens: SubmitTokensService) {}

  @Interval(REAP_INTERVAL_MS)
  async reapOnSchedule(): Promise<void> {
    try {
      await this.reapExpiredSubmitTokens();
    } catch (err) {
      this.logger.error({ err }, 'reaping expired submit tokens failed; will retry next tick');
    }
  }

  /** Deletes long-expired tokens batch by batch; returns how many. */
  async reapExpiredSubmitTokens(): Promise<number> {
    const total = await deleteInBatches((size) => this.submitTokens.reapExpiredSubmitTokens(size));
    if (total) this.logger.log({ deleted: total }, 'reaped expired submit tokens');
    return total;
  }
}
