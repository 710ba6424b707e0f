import { Inject, Injectable, Logger, type OnModuleDestroy, type OnModuleInit } from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { setTimeout as sleep } from 'node:timers/promises';
import type { AppConfig } from '../config/app-config.js';
import { APP_CONFIG } from '../config/config.module.js';
import { AtomicPhases, Database, type LeasedKey } from '@idempotent-orders/idempotency';
import type { StalePaymentSettler } from '../orders/stale-payments.js';
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

/**
 * While the provider looks away, runs do not ask it until the next probe: keys a run could not ask about wait that
 * long (set aside), RECONCILE_BACKOFF_FIRST_MS (or the interval, if longer) doubling for each run in a row that found
 * it away, up to RECONCILE_BACKOFF_MAX_MS. An outage costs one probe and a few writes per backoff, never a loop.
 */
const RECONCILE_BACKOFF_FIRST_MS = 1_000;
const RECONCILE_BACKOFF_MAX_MS = 60_000;
/** Lookups in a row that could not be answered before a run takes the provider for away (one, once it has been away). */
const OUTAGE_AFTER_UNREACHABLE = 2;
/**
 * How often the sweep looks for rows an older build failed as never reached (ProviderAttempts.adoptUnreached): they
 * appear only while such a build serves, and a look every run would be a write every tick for nothing.
 */
const ADOPT_EVERY_MS = 10_000;
/**
 * On shutdown a run stops at its next key; a lookup in flight is not waited for longer than this (its answer is not
 * written: the key's lease runs out and the next run asks again), so a stop stays well within the drain deadline.
 */
export const RECONCILER_STOP_WAIT_MS = 3_000;

/** The answer for a charge or refund the provider never saw: final, so a retry replays 402 instead of waiting forever. */
const NEVER_REACHED: ProviderOutcome = { status: 'failed', failureCode: 'provider_unreachable' };

/** settleKey's answer when the provider could not be asked. */
const UNREACHABLE = Symbol('unreachable');

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
export class PaymentReconciler implements OnModuleInit, OnModuleDestroy, StalePaymentSettler {
  private readonly logger = new Logger('PaymentReconciler');
  private running?: Promise<number>;
  private stopping = false;
  /** Runs in a row whose lookups found the provider away: the backoff of the keys they set aside. */
  private outageRuns = 0;
  /** While the provider is away: no run asks it before then (Date.now() ms). */
  private probeAt = 0;
  private adoptedAt = 0;

  constructor(
    private readonly db: Database,
    private readonly phases: AtomicPhases,
    private readonly psp: PspClient,
    private readonly settlement: PaymentSettlement,
    private readonly attempts: ProviderAttempts,
    private readonly lateCharges: LateChargeRefunder,
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
    this.stopping = true;
    if (this.scheduler.doesExist('interval', RECONCILER_JOB)) this.scheduler.deleteInterval(RECONCILER_JOB);
    if (!this.running) return;
    let timer: NodeJS.Timeout | undefined;
    const waited = new Promise<void>((resolve) => (timer = setTimeout(resolve, RECONCILER_STOP_WAIT_MS)));
    await Promise.race([this.running.catch(() => undefined), waited]);
    clearTimeout(timer);
  }

  /**
   * One run over every unfinished key whose lease has run out, then the sweep of rows failed as never reached;
   * a call during a run joins it. Returns how many keys it settled.
   */
  reconcile(): Promise<number> {
    this.running ??= this.reconcileAll().finally(() => (this.running = undefined));
    return this.running;
  }

  /**
   * Each key at most once: a key it could not decide is set aside (past this run) or left leased, so the next
   * batch never returns it; a batch that still does (a clock step) ends the run. Once the provider looks away,
   * the rest of the keys wait out the backoff unasked. The sweep always runs, unless the app is stopping.
   */
  private async reconcileAll(): Promise<number> {
    let settled = 0;
    let unreachableInARow = 0;
    let asked = 0;
    let unreachable = 0;
    const visited = new Set<string>();
    const backoffMs = this.outageBackoffMs();
    const outageAfter = this.outageRuns > 0 ? 1 : OUTAGE_AFTER_UNREACHABLE;
    // The provider away and not yet due for a probe: the keys stay as they are (no write), the sweep still runs.
    for (let more = Date.now() >= this.probeAt; more && !this.stopping;) {
      const keys = await this.phases.takeOverExpiredLeases([PAYMENT_CREATED, REFUND_CREATED], RECONCILE_BATCH);
      more = keys.length === RECONCILE_BATCH;
      for (const key of keys) {
        if (visited.has(key.id)) more = false;
        if (visited.has(key.id) || this.stopping || unreachableInARow >= outageAfter) {
          await this.phases.setAside(key, backoffMs);
          continue;
        }
        visited.add(key.id);
        try {
          const result = await this.settleKey(key, (leased) => this.phases.setAside(leased, backoffMs));
          asked++;
          if (result === UNREACHABLE) {
            unreachable++;
            unreachableInARow++;
          } else {
            unreachableInARow = 0;
            if (result?.kind === 'answered') settled++;
          }
        } catch (err) {
          this.logger.error({ err, keyId: key.id }, 'reconciling a key failed; its lease runs out and it is tried again');
        }
      }
      if (unreachableInARow >= outageAfter) more = false;
    }
    const adopt = Date.now() >= this.adoptedAt + ADOPT_EVERY_MS;
    if (adopt) this.adoptedAt = Date.now();
    for (const table of ['payments', 'refunds'] as const) {
      if (this.stopping) break;
      const swept = await this.sweepUnreached(table, adopt);
      asked += swept.asked;
      unreachable += swept.unreachable;
    }
    this.noteOutage(asked, unreachable, visited.size, backoffMs);
    return settled;
  }

  /** How long keys this run cannot ask about are set aside: RECONCILE_BACKOFF_FIRST_MS (or the interval), doubling per run away. */
  private outageBackoffMs(): number {
    const first = Math.max(RECONCILE_BACKOFF_FIRST_MS, this.config.reconcileIntervalMs);
    return Math.min(Math.max(first, RECONCILE_BACKOFF_MAX_MS), first * 2 ** Math.min(this.outageRuns, 16));
  }

  /** A run whose every lookup failed counts as one more run away (one log line per run, not per key); any answer resets it. */
  private noteOutage(asked: number, unreachable: number, keys: number, backoffMs: number): void {
    if (asked === 0) return;
    if (unreachable < asked) {
      if (this.outageRuns > 0) this.logger.log({ runsAway: this.outageRuns }, 'the provider answers lookups again');
      this.outageRuns = 0;
      return;
    }
    this.outageRuns++;
    this.probeAt = Date.now() + backoffMs;
    this.logger.warn(
      { keys, lookups: asked, setAsideMs: backoffMs, runsAway: this.outageRuns },
      'the provider could not be asked; unsettled keys wait for a later run',
    );
  }

  /**
   * For a pay that found another key's payment of the order pending: if that key's lease has run
   * out (its request gave up or died), settle it now rather than refuse the order until the next
   * reconciler run — which may never come, with RECONCILE_INTERVAL_MS=0. True when it settled.
   */
  async reconcileStalePayment(paymentId: string): Promise<boolean> {
    const [payment] = await this.db.query<{ idempotency_key_id: string | null }>(
      `SELECT idempotency_key_id FROM payments WHERE id = $1 AND status = 'pending'`,
      [paymentId],
    );
    const key = payment?.idempotency_key_id ? await this.phases.takeOverLease(payment.idempotency_key_id) : undefined;
    if (!key) return false;
    const settled = await this.settleKey(key, (leased) => this.phases.release(leased));
    return settled !== UNREACHABLE && settled?.kind === 'answered';
  }

  /**
   * For a resumed request that will send nothing more: the reconciler's decision, under the request's lease.
   * The key's answer once settled; undefined while it cannot be decided (the key is then released or set aside).
   */
  async decide(key: LeasedKey): Promise<Extract<Settled, { kind: 'answered' }> | undefined> {
    const settled = await this.settleKey(key, (leased) => this.phases.release(leased));
    return settled !== UNREACHABLE && settled?.kind === 'answered' ? settled : undefined;
  }

  /**
   * The cancel's "settle it first": each pending payment of the order whose key's lease has run out. Looked for
   * on the caller's connection (inside its transaction, if it has one); only when there is one is it settled, on
   * connections of its own that commit before the caller goes on (outsideTransaction).
   */
  /** A cancel's first step (StalePaymentSettler): the order's pending payments past their lease, settled as a new pay would. */
  async settleStalePaymentsOf(clientId: string, orderId: string): Promise<void> {
    const stale = await this.db.query<{ id: string }>(
      `SELECT p.id FROM payments p JOIN idempotency_keys k ON k.id = p.idempotency_key_id
        WHERE p.order_id = $1 AND p.client_id = $2 AND p.status = 'pending' AND k.locked_until <= clock_timestamp()`,
      [orderId, clientId],
    );
    for (const { id } of stale) await this.db.outsideTransaction(() => this.reconcileStalePayment(id));
  }

  /**
   * The key's settlement; undefined when it cannot be decided yet because the provider has nothing and an abandoned
   * attempt may still reach it (the key is set aside until that window has passed; the request's own retry may still
   * resume it); UNREACHABLE when the provider could not be asked (`putBack` gives the key up: released for a request,
   * set aside for the backoff by a run).
   */
  private async settleKey(key: LeasedKey, putBack: (key: LeasedKey) => Promise<void>): Promise<Settled | typeof UNREACHABLE | undefined> {
    const table: AttemptTable = key.recoveryPoint === PAYMENT_CREATED ? 'payments' : 'refunds';
    const [row] =
      table === 'payments'
        ? await this.db.query<RecheckRow>(
            `SELECT id, id AS payment_id, amount_minor, currency FROM payments WHERE idempotency_key_id = $1`,
            [key.id],
          )
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
          this.logger.log(
            { keyId: key.id, [table === 'payments' ? 'paymentId' : 'refundId']: row.id, windowLeftMs: Math.round(windowLeftMs) },
            'not at the provider yet, but an attempt may still land: decided later',
          );
          return undefined;
        }
        // The window has closed, and the second lookup starts after it and a second after the first: whatever was on
        // its way has arrived by then.
        await sleep(NOT_FOUND_RECHECK_MS);
        outcome = (await lookUp()) ?? NEVER_REACHED;
      }
    } catch (err) {
      if (!(err instanceof PspUnreachableError)) throw err;
      await putBack(key);
      return UNREACHABLE;
    }
    // Stopping: the pool is about to close. The lease runs out and the next run (or instance) asks again.
    if (this.stopping) return undefined;
    const result =
      table === 'payments'
        ? await this.settlement.settlePayment(row.id, outcome, key.leaseToken)
        : await this.settlement.settleRefund(row.id, outcome, key.leaseToken);
    this.logger.log(
      { keyId: key.id, [table === 'payments' ? 'paymentId' : 'refundId']: row.id, outcome: outcome.status, result: result.kind },
      'reconciled',
    );
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
   * applied to the books. Rows an older build failed so, which it never put on the list, are put on it first
   * (ProviderAttempts.adoptUnreached; `adopt`: this run looks for them). A row whose lookup fails stays on the list;
   * at the first such failure the provider is taken as away and the rest of the batch is put back unasked, as is
   * a batch due while the provider is away and not yet due for a probe. Runs with the reconciler
   * (RECONCILE_INTERVAL_MS=0 turns both off).
   */
  async sweepUnreached(table: AttemptTable, adopt = true): Promise<{ asked: number; unreachable: number; repaired: number }> {
    const swept = { asked: 0, unreachable: 0, repaired: 0 };
    if (adopt) await this.attempts.adoptUnreached(table);
    const due = await this.attempts.dueForRecheck(table, RECONCILE_BATCH);
    if (due.length === 0) return swept;
    const ids = due.map((d) => d.id);
    const awayMs = this.probeAt - Date.now();
    if (awayMs > 0) {
      // The provider away: asked at the probe, not now.
      await this.attempts.recheckAgain(ids, awayMs);
      return swept;
    }
    const rows =
      table === 'payments'
        ? await this.db.query<RecheckRow>(
            `SELECT id, id AS payment_id, amount_minor, currency FROM payments WHERE id = ANY($1::uuid[]) AND status = 'failed'`,
            [ids],
          )
        : await this.db.query<RecheckRow>(
            `SELECT r.id, r.payment_id, r.amount_minor, p.currency FROM refunds r JOIN payments p ON p.id = r.payment_id WHERE r.id = ANY($1::uuid[]) AND r.status = 'failed'`,
            [ids],
          );
    const last = new Set(due.filter((d) => d.last).map((d) => d.id));
    for (const [i, row] of rows.entries()) {
      if (this.stopping) break;
      let outcome: ProviderOutcome | undefined;
      try {
        swept.asked++;
        outcome = await this.lookUp(table, row);
      } catch (err) {
        if (!(err instanceof PspUnreachableError)) {
          this.logger.error({ err, table, id: row.id }, 'sweeping a row failed; it is asked about again later');
          continue;
        }
        swept.unreachable++;
        // Not answered: this row and the rest are asked again after the backoff, the last look of a row included.
        await this.attempts.recheckAgain(
          rows.slice(i).map((r) => r.id),
          this.outageBackoffMs(),
        );
        break;
      }
      try {
        if (outcome?.status === 'succeeded' && (await this.repair(table, row, outcome.providerId))) swept.repaired++;
        else if (outcome?.status !== 'succeeded' && last.has(row.id)) await this.attempts.stopRechecking(row.id);
      } catch (err) {
        this.logger.error({ err, table, id: row.id }, 'repairing a late landing failed; it is asked about again later');
      }
    }
    return swept;
  }

  /** The money the provider moved on a row we failed: a charge is refunded, a refund applied to the books. */
  private async repair(table: AttemptTable, row: RecheckRow, providerId: string): Promise<boolean> {
    if (table === 'refunds')
      return (await this.db.transaction(() => this.settlement.applyLateRefund(row.id, providerId, 'sweep'))) === 'applied';
    const lateRefundId = await this.db.transaction(() =>
      this.settlement.recordLateCharge({ id: row.id, amount_minor: row.amount_minor }, providerId, 'sweep'),
    );
    if (lateRefundId) this.lateCharges.refundInBackground(lateRefundId);
    return lateRefundId !== undefined;
  }
}
