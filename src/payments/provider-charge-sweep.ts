import { Inject, Injectable, Logger, type OnModuleDestroy, type OnModuleInit } from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { Database, monotonicNow } from '@idempotent-orders/idempotency';
import type { AppConfig } from '../config/app-config.js';
import { APP_CONFIG } from '../config/config.module.js';
import { PspClient, type PspCharge } from '../psp-client/psp-client.js';
import { LateChargeRefunder } from './late-charge-refunder.js';
import { LostPayments } from './lost-payments.js';

const SWEEP_JOB = 'provider-charge-sweep';
/** With no cursor yet (the first run on a database), the sweep lists this far back. */
const FIRST_RUN_LOOKBACK_MS = 15 * 60_000;
/**
 * Each run lists from the cursor less this: a charge is dated by the provider's clock when it is created, before it
 * commits there, so one dated just before the last run began may have been listed by nobody yet.
 */
const OVERLAP_MS = 2 * 60_000;
const PAGE_SIZE = 100;
/** One page's call, retries included: a provider that does not answer in this time is asked again at the next run. */
const PAGE_DEADLINE_MS = 10_000;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * Lists the provider's recent charges and repairs each succeeded one whose payment our database does not have
 * (LostPayments: refunded, its order voided if gone). The provider's webhook finds the same charges; this finds the ones
 * whose webhook never came or came while the payment was still here (before a failover lost it). Every instance may run
 * it: the late refund's unique charge id makes each repair once.
 * The cursor (provider_charge_sweep) is in our database and moves only after a complete run: a failover that loses a
 * payment loses every advance committed after it as well, so the next run lists that payment's charge again, however
 * far behind the new primary was. A run that cannot list or repair everything leaves it where it was.
 */
@Injectable()
export class ProviderChargeSweep implements OnModuleInit, OnModuleDestroy {
  private readonly logger = new Logger('ProviderChargeSweep');
  private running?: Promise<number>;

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
    const startedAt = new Date();
    const [cursor] = await this.db.query<{ listed_from: Date }>(`SELECT listed_from FROM provider_charge_sweep`);
    const createdAfter = new Date((cursor?.listed_from.getTime() ?? startedAt.getTime() - FIRST_RUN_LOOKBACK_MS) - OVERLAP_MS);
    let repaired = 0;
    let complete = true;
    for (let startingAfter: string | undefined; ;) {
      const page = await this.psp.listCharges({ createdAfter, startingAfter, limit: PAGE_SIZE }, monotonicNow() + PAGE_DEADLINE_MS);
      if (page.kind !== 'succeeded') {
        this.logger.warn({ result: page, createdAfter }, "could not list the provider's charges; the next run lists them again");
        return repaired;
      }
      const result = await this.repairLost(page.value.items);
      repaired += result.repaired;
      complete &&= result.complete;
      if (!page.value.hasMore || page.value.items.length === 0) break;
      startingAfter = page.value.items[page.value.items.length - 1].id;
    }
    // Never backwards: another instance's run may have moved it further meanwhile.
    if (complete)
      await this.db.query(
        `INSERT INTO provider_charge_sweep (id, listed_from) VALUES (1, $1)
         ON CONFLICT (id) DO UPDATE SET listed_from = greatest(provider_charge_sweep.listed_from, EXCLUDED.listed_from)`,
        [startedAt],
      );
    return repaired;
  }

  /** The succeeded charges of the page whose payment is not here, each repaired in a transaction of its own. */
  private async repairLost(charges: PspCharge[]): Promise<{ repaired: number; complete: boolean }> {
    // Ours carry this deployment's id, our payment's UUID and a positive amount; anything else at the provider is
    // another's (a deployment or service sharing the account), not ours to judge.
    const candidates = charges.filter(
      (c) =>
        this.lostPayments.madeHere(c.metadata.deploymentId) &&
        c.status === 'succeeded' &&
        UUID.test(c.metadata.paymentId) &&
        UUID.test(c.metadata.orderId) &&
        Number.isSafeInteger(c.amountMinor) &&
        c.amountMinor > 0 &&
        /^[A-Z]{3}$/.test(c.currency),
    );
    if (candidates.length === 0) return { repaired: 0, complete: true };
    const missing = await this.db.query<{ id: string }>(
      `SELECT u.id FROM unnest($1::uuid[]) AS u(id) WHERE NOT EXISTS (SELECT 1 FROM payments p WHERE p.id = u.id)`,
      [candidates.map((c) => c.metadata.paymentId)],
    );
    const lost = new Set(missing.map((row) => row.id));
    let repaired = 0;
    let complete = true;
    for (const charge of candidates.filter((c) => lost.has(c.metadata.paymentId.toLowerCase()))) {
      try {
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
      } catch (err) {
        // The others are still repaired; the cursor stays, so this one is tried again next run (and logged again).
        complete = false;
        this.logger.error(
          { err, chargeId: charge.id, alert: true },
          'could not repair the charge of a lost payment; the next run tries again',
        );
      }
    }
    return { repaired, complete };
  }
}
