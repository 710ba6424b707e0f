import { Inject, Injectable, Logger, type OnModuleDestroy, type OnModuleInit } from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { setTimeout as sleep } from 'node:timers/promises';
import type { AppConfig } from '../config/app-config.js';
import { APP_CONFIG } from '../config/config.module.js';
import { AtomicPhases, Database, type LeasedKey } from '#idempotency';
import { OrdersService } from '../orders/orders.service.js';
import { PspClient, PspUnreachableError } from '../psp-client/psp-client.js';
import { LateChargeRefunder } from './late-charge-refunder.js';
import { type ProviderOutcome, PaymentSettlement, type Settled } from './payment-settlement.js';
import { PAYMENT_CREATED, REFUND_CREATED } from './payment-records.js';
import { type AttemptTable, ProviderAttempts } from './provider-attempts.js';
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

/** What the sweep reads of a row it asks the provider about again. */
interface RecheckRow {
  id: string;
  payment_id: string;
  amount_minor: string;
  currency: string;
}

/**
 * Settles payments and refunds whose request gave up (an unknown outcome, a crash) once their
 * lease has run out. It takes each key's lease with the same conditional UPDATE a retry uses, so
 * a reconciler and a retry never act on one payment at once, and SKIP LOCKED lets N instances
 * share the work. Each is looked up at the provider by our own id and settled as phase 3 would,
 * completing the key, so a later retry replays the final answer. It never decides "the provider
 * never saw it" while an abandoned attempt may still land (ProviderAttempts), and it sweeps rows it
 * failed that way for money that landed after every bound.
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
    private readonly attempts: ProviderAttempts,
    private readonly lateCharges: LateChargeRefunder,
    private readonly scheduler: SchedulerRegistry,
    orders: OrdersService,
    @Inject(APP_CONFIG) private readonly config: AppConfig,
  ) {
    // A cancel that finds a pending payment past its lease settles it first, as a new pay does. Orders cannot import
    // payments (payments import orders), so the cancel is handed this instead.
    orders.settleStalePaymentsWith((clientId, orderId) => this.reconcileStalePaymentsOf(clientId, orderId));
  }

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

  /**
   * One run over every unfinished key whose lease has run out, then the sweep of rows failed as never reached;
   * a call during a run joins it. Returns how many keys it settled.
   */
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
      if (keys.length < RECONCILE_BATCH) break;
    }
    await this.sweepUnreached('payments');
    await this.sweepUnreached('refunds');
    return settled;
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

  /**
   * For a resumed request that will send nothing more: the reconciler's decision, under the request's lease.
   * The key's answer once settled; undefined while it cannot be decided (the key is then released or set aside).
   */
  async decide(key: LeasedKey): Promise<Extract<Settled, { kind: 'answered' }> | undefined> {
    const settled = await this.settleKey(key);
    return settled?.kind === 'answered' ? settled : undefined;
  }

  /**
   * The cancel's "settle it first": each pending payment of the order whose key's lease has run out. Looked for
   * on the caller's connection (inside its transaction, if it has one); only when there is one is it settled, on
   * connections of its own that commit before the caller goes on (outsideTransaction).
   */
  private async reconcileStalePaymentsOf(clientId: string, orderId: string): Promise<void> {
    const stale = await this.db.query<{ id: string }>(
      `SELECT p.id FROM payments p JOIN idempotency_keys k ON k.id = p.idempotency_key_id
        WHERE p.order_id = $1 AND p.client_id = $2 AND p.status = 'pending' AND k.locked_until <= clock_timestamp()`,
      [orderId, clientId],
    );
    for (const { id } of stale) await this.db.outsideTransaction(() => this.reconcileStalePayment(id));
  }

  /**
   * True when it settled the payment or refund; false when it could not be decided yet: the provider could not
   * be asked (the lease is released for the next round), or it has nothing and an abandoned attempt may still
   * reach it (the key is set aside until that window has passed; the request's own retry may still resume it).
   */
  private async reconcileKey(key: LeasedKey): Promise<boolean> {
    return (await this.settleKey(key))?.kind === 'answered';
  }

  private async settleKey(key: LeasedKey): Promise<Settled | undefined> {
    const table: AttemptTable = key.recoveryPoint === PAYMENT_CREATED ? 'payments' : 'refunds';
    const [row] =
      table === 'payments'
        ? await this.db.query<RecheckRow>(`SELECT id, id AS payment_id, amount_minor, currency FROM payments WHERE idempotency_key_id = $1`, [key.id])
        : await this.db.query<RecheckRow>(
            `SELECT r.id, r.payment_id, r.amount_minor, p.currency FROM refunds r JOIN payments p ON p.id = r.payment_id WHERE r.idempotency_key_id = $1`,
            [key.id],
          );
    if (!row) throw new Error(`unfinished key ${key.id} has no ${table === 'payments' ? 'payment' : 'refund'}`);
    const lookUp = () => this.lookUp(table, row);
    let outcome: ProviderOutcome | undefined;
    try {
      outcome = await lookUp();
      if (!outcome) {
        const windowLeftMs = await this.attempts.landingWindowLeft(table, row.id);
        if (windowLeftMs > 0) {
          await this.phases.setAside(key, windowLeftMs);
          this.logger.log({ keyId: key.id, [table === 'payments' ? 'paymentId' : 'refundId']: row.id, windowLeftMs: Math.round(windowLeftMs) }, 'not at the provider yet, but an attempt may still land: decided later');
          return undefined;
        }
        // The window has closed, and the second lookup starts after it and a second after the first: whatever was on
        // its way has arrived by then.
        await sleep(NOT_FOUND_RECHECK_MS);
        outcome = (await lookUp()) ?? NEVER_REACHED;
      }
    } catch (err) {
      if (!(err instanceof PspUnreachableError)) throw err;
      await this.phases.release(key);
      return undefined;
    }
    const result = table === 'payments' ? await this.settlement.settlePayment(row.id, outcome, key.leaseToken) : await this.settlement.settleRefund(row.id, outcome, key.leaseToken);
    this.logger.log({ keyId: key.id, [table === 'payments' ? 'paymentId' : 'refundId']: row.id, outcome: outcome.status, result: result.kind }, 'reconciled');
    return result;
  }

  private lookUp(table: AttemptTable, row: RecheckRow): Promise<ProviderOutcome | undefined> {
    const amountMinor = Number(row.amount_minor);
    return table === 'payments'
      ? this.psp.findChargesByPayment(row.id, { amountMinor, currency: row.currency }).then(foundChargeOutcome)
      : this.psp.findRefundsByRefund(row.id, { paymentId: row.payment_id, amountMinor }).then(foundRefundOutcome);
  }

  /**
   * Money can land after every bound (a provider slower than PSP_MAX_LATENCY_MS promised, an answer lost and
   * the webhook off). So rows failed as provider_unreachable are asked about again at doubling intervals for
   * PSP_KEY_RETENTION_HOURS (ProviderAttempts.dueForRecheck): a charge found is refunded, a refund found is
   * applied to the books. Runs with the reconciler (RECONCILE_INTERVAL_MS=0 turns both off).
   */
  async sweepUnreached(table: AttemptTable): Promise<number> {
    const ids = await this.attempts.dueForRecheck(table, RECONCILE_BATCH);
    if (ids.length === 0) return 0;
    const rows =
      table === 'payments'
        ? await this.db.query<RecheckRow>(`SELECT id, id AS payment_id, amount_minor, currency FROM payments WHERE id = ANY($1::uuid[]) AND status = 'failed'`, [ids])
        : await this.db.query<RecheckRow>(
            `SELECT r.id, r.payment_id, r.amount_minor, p.currency FROM refunds r JOIN payments p ON p.id = r.payment_id WHERE r.id = ANY($1::uuid[]) AND r.status = 'failed'`,
            [ids],
          );
    let repaired = 0;
    for (const row of rows) {
      try {
        const outcome = await this.lookUp(table, row);
        if (outcome?.status !== 'succeeded') continue;
        if (table === 'payments') {
          const lateRefundId = await this.db.transaction(() => this.settlement.recordLateCharge({ id: row.id, amount_minor: row.amount_minor }, outcome.providerId, 'sweep'));
          if (lateRefundId) {
            this.lateCharges.refundInBackground(lateRefundId);
            repaired++;
          }
        } else if ((await this.db.transaction(() => this.settlement.applyLateRefund(row.id, outcome.providerId, 'sweep'))) === 'applied') {
          repaired++;
        }
      } catch (err) {
        // Its recheck_at has moved on already: asked again at the next interval.
        if (!(err instanceof PspUnreachableError)) this.logger.error({ err, table, id: row.id }, 'sweeping a row failed; it is asked about again later');
      }
    }
    return repaired;
  }
}
