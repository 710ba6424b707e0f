import { Inject, Injectable, Logger, type OnModuleDestroy, type OnModuleInit } from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { setTimeout as sleep } from 'node:timers/promises';
import type { AppConfig } from '../config/app-config.js';
import { APP_CONFIG } from '../config/config.module.js';
import { Database } from '../database/database.service.js';
import { AtomicPhases, type LeasedKey } from '../idempotency/atomic-phases.js';
import { PspClient, PspUnreachableError } from '../psp-client/psp-client.js';
import type { ProviderOutcome } from './payment-settlement.js';
import { PaymentSettlement } from './payment-settlement.js';
import { PAYMENT_CREATED, REFUND_CREATED } from './payment-records.js';
import { foundChargeOutcome, foundRefundOutcome } from './provider-outcomes.js';

const RECONCILER_JOB = 'payment-reconciler';

/** Keys taken per round: each needs one or two lookups, so a round stays short and other instances get the rest. */
const RECONCILE_BATCH = 20;
/**
 * "Not at the provider" is decided by two lookups at least this far apart: a charge that was being
 * written at the provider during the first lookup is visible by the second.
 */
const NOT_FOUND_RECHECK_MS = 1_000;

/** The answer for a charge or refund the provider never saw: final, so a retry replays 402 instead of waiting forever. */
const NEVER_REACHED: ProviderOutcome = { status: 'failed', failureCode: 'provider_unreachable' };

/**
 * Settles payments and refunds whose request gave up (an unknown outcome, a crash) once their
 * lease has run out. It takes each key's lease with the same conditional UPDATE a retry uses, so
 * a reconciler and a retry never act on one payment at once, and SKIP LOCKED lets N instances
 * share the work. Each is looked up at the provider by our own id and settled as phase 3 would,
 * completing the key, so a later retry replays the final answer.
 */
@Injectable()
export class PaymentReconciler implements OnModuleInit, OnModuleDestroy {
  private readonly logger = new Logger('PaymentReconciler');
  private running?: Promise<number>;

  constructor(
    private readonly db: Database,
    private readonly phases: AtomicPhases,
    private readonly psp: PspClient,
    private readonly settlement: PaymentSettlement,
    private readonly scheduler: SchedulerRegistry,
    @Inject(APP_CONFIG) private readonly config: AppConfig,
  ) {}

  /** Registered with @nestjs/schedule, which clears it when the app closes; the period comes from config, so not @Interval(). */
  onModuleInit(): void {
    if (this.config.reconcileIntervalMs === 0) return;
    const tick = () => {
      // Overlapping runs are skipped: a slow round (lookups, the 1 s recheck) must not pile up.
      if (!this.running) this.reconcile().catch((err: unknown) => this.logger.error({ err }, 'reconciling failed; will retry next tick'));
    };
    this.scheduler.addInterval(RECONCILER_JOB, setInterval(tick, this.config.reconcileIntervalMs));
  }

  /** No new run starts, and a run in progress finishes, before the pool closes (the scheduler itself stops later). */
  async onModuleDestroy(): Promise<void> {
    if (this.scheduler.doesExist('interval', RECONCILER_JOB)) this.scheduler.deleteInterval(RECONCILER_JOB);
    await this.running?.catch(() => undefined);
  }

  /** One run over every unfinished key whose lease has run out; a call during a run joins it. Returns how many it settled. */
  reconcile(): Promise<number> {
    this.running ??= this.reconcileAll().finally(() => (this.running = undefined));
    return this.running;
  }

  private async reconcileAll(): Promise<number> {
    let settled = 0;
    for (;;) {
      const keys = await this.phases.takeOverExpiredLeases([PAYMENT_CREATED, REFUND_CREATED], RECONCILE_BATCH);
      for (const key of keys) {
        try {
          if (await this.reconcileKey(key)) settled++;
        } catch (err) {
          this.logger.error({ err, keyId: key.id }, 'reconciling a key failed; its lease runs out and it is tried again');
        }
      }
      if (keys.length < RECONCILE_BATCH) return settled;
    }
  }

  /**
   * For a pay that found another key's payment of the order pending: if that key's lease has run
   * out (its request gave up or died), settle it now rather than refuse the order until the next
   * reconciler run — which may never come, with RECONCILE_INTERVAL_MS=0. True when it settled.
   */
  async reconcileStalePayment(paymentId: string): Promise<boolean> {
    const [payment] = await this.db.query<{ idempotency_key_id: string | null }>(`SELECT idempotency_key_id FROM payments WHERE id = $1 AND status = 'pending'`, [paymentId]);
    const key = payment?.idempotency_key_id ? await this.phases.takeOverLease(payment.idempotency_key_id) : undefined;
    return key ? this.reconcileKey(key) : false;
  }

  /** True when it settled the payment or refund; false when the provider could not be asked (the lease is released for the next round). */
  private async reconcileKey(key: LeasedKey): Promise<boolean> {
    const isPayment = key.recoveryPoint === PAYMENT_CREATED;
    const [row] = await this.db.query<{ id: string }>(`SELECT id FROM ${isPayment ? 'payments' : 'refunds'} WHERE idempotency_key_id = $1`, [key.id]);
    if (!row) throw new Error(`unfinished key ${key.id} has no ${isPayment ? 'payment' : 'refund'}`);
    const lookUp = isPayment
      ? async () => foundChargeOutcome(await this.psp.findChargesByPayment(row.id))
      : async () => foundRefundOutcome(await this.psp.findRefundsByRefund(row.id));
    let outcome: ProviderOutcome | undefined;
    try {
      outcome = await lookUp();
      if (!outcome) {
        await sleep(NOT_FOUND_RECHECK_MS);
        outcome = (await lookUp()) ?? NEVER_REACHED;
      }
    } catch (err) {
      if (!(err instanceof PspUnreachableError)) throw err;
      await this.phases.release(key);
      return false;
    }
    const result = isPayment ? await this.settlement.settlePayment(row.id, outcome, key.leaseToken) : await this.settlement.settleRefund(row.id, outcome, key.leaseToken);
    this.logger.log({ keyId: key.id, [isPayment ? 'paymentId' : 'refundId']: row.id, outcome: outcome.status, result: result.kind }, 'reconciled');
    return result.kind === 'answered';
  }
}
