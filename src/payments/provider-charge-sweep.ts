import { Inject, Injectable, Logger, type OnModuleDestroy, type OnModuleInit } from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { Database, monotonicNow } from '@idempotent-orders/idempotency';
import type { AppConfig } from '../config/app-config.js';
import { APP_CONFIG } from '../config/config.module.js';
import { PspClient, type PspCharge } from '../psp-client/psp-client.js';
import { LateChargeRefunder } from './late-charge-refunder.js';
import { LostPayments } from './lost-payments.js';

const SWEEP_JOB = 'provider-charge-sweep';
/** The first run after start lists this far back: a failover (or a crash of ours) just before the start is covered. */
const FIRST_RUN_LOOKBACK_MS = 15 * 60_000;
/**
 * Each later run lists from the start of the last complete run, less this: a charge whose payment was still here when a
 * run listed it, and which a failover then lost, is listed again after it. It covers the commits a failover can lose
 * (the replication lag it is allowed, seconds) and the provider's clock against ours.
 */
const OVERLAP_MS = 5 * 60_000;
const PAGE_SIZE = 100;
/** One page's call, retries included: a provider that does not answer in this time is asked again at the next run. */
const PAGE_DEADLINE_MS = 10_000;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * Lists the provider's recent charges and repairs each succeeded one whose payment our database does not have
 * (LostPayments: refunded, its order voided if gone). The provider's webhook finds the same charges; this finds the ones
 * whose webhook never came or came while the payment was still here (before a failover lost it). Every instance may run
 * it: the late refund's unique charge id makes each repair once. A run that cannot list every page leaves its cursor
 * where it was, so the next run lists the same charges again.
 */
@Injectable()
export class ProviderChargeSweep implements OnModuleInit, OnModuleDestroy {
  private readonly logger = new Logger('ProviderChargeSweep');
  private running?: Promise<number>;
  /** Date.now() when the last complete run started; undefined before the first. */
  private lastCompleteRunAt?: number;

  constructor(
    private readonly db: Database,
    private readonly psp: PspClient,
    private readonly lostPayments: LostPayments,
    private readonly lateRefunds: LateChargeRefunder,
    private readonly scheduler: SchedulerRegistry,
    @Inject(APP_CONFIG) private readonly config: AppConfig,
  ) {}

  onModuleInit(): void {
    if (this.config.providerSweepIntervalMs === 0) return;
    const tick = () => {
      if (!this.running)
        this.sweep().catch((err: unknown) => this.logger.error({ err }, 'sweeping the provider failed; will retry next tick'));
    };
    this.scheduler.addInterval(SWEEP_JOB, setInterval(tick, this.config.providerSweepIntervalMs));
  }

  async onModuleDestroy(): Promise<void> {
    if (this.scheduler.doesExist('interval', SWEEP_JOB)) this.scheduler.deleteInterval(SWEEP_JOB);
    await this.running?.catch(() => undefined);
  }

  /** One run (a call during a run joins it); how many charges of lost payments it repaired. */
  sweep(): Promise<number> {
    this.running ??= this.sweepOnce().finally(() => (this.running = undefined));
    return this.running;
  }

  private async sweepOnce(): Promise<number> {
    const startedAt = Date.now();
    const createdAfter = new Date(
      this.lastCompleteRunAt === undefined ? startedAt - FIRST_RUN_LOOKBACK_MS : this.lastCompleteRunAt - OVERLAP_MS,
    );
    let repaired = 0;
    for (let startingAfter: string | undefined; ;) {
      const page = await this.psp.listCharges({ createdAfter, startingAfter, limit: PAGE_SIZE }, monotonicNow() + PAGE_DEADLINE_MS);
      if (page.kind !== 'succeeded') {
        this.logger.warn({ result: page, createdAfter }, "could not list the provider's charges; the next run lists them again");
        return repaired;
      }
      repaired += await this.repairLost(page.value.items);
      if (!page.value.hasMore || page.value.items.length === 0) break;
      startingAfter = page.value.items[page.value.items.length - 1].id;
    }
    this.lastCompleteRunAt = startedAt;
    return repaired;
  }

  /** The succeeded charges of the page whose payment is not here, each repaired in a transaction of its own. */
  private async repairLost(charges: PspCharge[]): Promise<number> {
    // Ours carry our payment's UUID; anything else at the provider is not ours to judge.
    const candidates = charges.filter((c) => c.status === 'succeeded' && UUID.test(c.metadata.paymentId) && UUID.test(c.metadata.orderId));
    if (candidates.length === 0) return 0;
    const missing = await this.db.query<{ id: string }>(
      `SELECT u.id FROM unnest($1::uuid[]) AS u(id) WHERE NOT EXISTS (SELECT 1 FROM payments p WHERE p.id = u.id)`,
      [candidates.map((c) => c.metadata.paymentId)],
    );
    const lost = new Set(missing.map((row) => row.id));
    let repaired = 0;
    for (const charge of candidates.filter((c) => lost.has(c.metadata.paymentId.toLowerCase()))) {
      const lateRefundId = await this.db.transaction(() =>
        this.lostPayments.repair(
          {
            chargeId: charge.id,
            paymentId: charge.metadata.paymentId,
            orderId: charge.metadata.orderId,
            amountMinor: charge.amountMinor,
            currency: charge.currency,
          },
          'provider_sweep',
        ),
      );
      if (lateRefundId) {
        repaired++;
        this.lateRefunds.refundInBackground(lateRefundId);
      }
    }
    return repaired;
  }
}
