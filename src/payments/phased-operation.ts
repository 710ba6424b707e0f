import { Injectable } from '@nestjs/common';
import {
  AtomicPhases,
  Database,
  type KeyScope,
  type LeasedKey,
  problemResponse,
  type StoredResponse,
} from '@idempotent-orders/idempotency';
import { PspClient, PspUnreachableError } from '../psp-client/psp-client.js';
import { paymentPending, providerUnavailable } from './payment-problems.js';
import type { PaymentRow } from './payment-records.js';
import { PaymentReconciler } from './payment-reconciler.js';
import type { ProviderOutcome, Settled } from './payment-settlement.js';
import { type AttemptTable, ProviderAttempts } from './provider-attempts.js';
import { type ProblemException } from '#service-kit';

/** What an idempotent payment endpoint answers: a stored response, sent as it is. */
export interface KeyAnswer {
  response: StoredResponse;
  replayed: boolean;
}

/** The row a phased operation calls the provider for: a payment or a refund. */
export type PhasedRow = Pick<PaymentRow, 'id' | 'status' | 'created_at'>;

/**
 * What differs between a payment and a refund; the phases, the resume and the fencing are PhasedOperation's.
 * `table` names the subject; `create` is phase 1's writes in the claim's transaction (the pending row, or a refusal stored as the answer),
 * ending at recovery point `created`; `load` reads the row of a resumed key; `find` looks the row up at the provider (a resume asks it
 * first); `send`
 * calls out under the row's outbound key by the holder's deadline (`earlierAttempt`: a resumed key's, so an attempt before it may still
 * land and a
 * refusal is no answer); `recorded` is what the row already says.
 */
export interface PhasedSubject<Row extends PhasedRow> {
  table: AttemptTable;
  created: string;
  create(keyId: string): Promise<{ row: Row } | { refusal: ProblemException }>;
  load(id: string): Promise<Row[]>;
  find(row: Row): Promise<ProviderOutcome | undefined>;
  send(row: Row, deadline: number, earlierAttempt: boolean): Promise<ProviderOutcome | undefined>;
  recorded(row: Row): ProviderOutcome;
  settle(id: string, outcome: ProviderOutcome, leaseToken: string): Promise<Settled>;
}

/** A new key's pending row, as phase 1 inserted and committed it; a resumed key's row is read again (it may have moved on). */
type Phase1<Row> = { answer: KeyAnswer } | { key: LeasedKey; resumed: false; row: Row } | { key: LeasedKey; resumed: true; id: string };

/**
 * A payment or refund in atomic phases (docs/contract.md#payments-and-refunds): the provider call cannot join our
 * transaction, and a timeout does not say whether it happened — so an unknown outcome is never final: the row
 * stays pending, and the same key (or the reconciler) asks again with the same outbound key, which the provider dedupes.
 */
@Injectable()
export class PhasedOperation {
  constructor(
    private readonly db: Database,
    private readonly phases: AtomicPhases,
    private readonly psp: PspClient,
    private readonly reconciler: PaymentReconciler,
    private readonly attempts: ProviderAttempts,
  ) {}

  async run<Row extends PhasedRow>(scope: KeyScope, subject: PhasedSubject<Row>): Promise<KeyAnswer> {
    const phase1 = await this.start(scope, subject);
    if ('answer' in phase1) return phase1.answer;
    return { response: await this.callAndSettle(subject, phase1), replayed: false };
  }

  /** Phase 1: the key acquired and, for a new key, the pending row written, in one transaction. */
  private start<Row extends PhasedRow>(scope: KeyScope, subject: PhasedSubject<Row>): Promise<Phase1<Row>> {
    return this.db.transaction(async (): Promise<Phase1<Row>> => {
      const acquired = await this.phases.acquire(scope);
      if (acquired.kind === 'completed') return { answer: { response: acquired.response, replayed: true } };
      if (acquired.kind === 'resumed') {
        // Only a key at its `created` point is ever committed unfinished, and its row was inserted with it.
        const id = await this.attempts.ofKey(subject.table, acquired.key.id);
        if (!id) throw new Error(`${subject.table} key ${acquired.key.id} is unfinished but has no row`);
        return { key: acquired.key, id, resumed: true };
      }
      // Before anything is written: with the provider known to be down, fail now and leave the key free.
      const breaker = this.psp.chargeBreakerOpen();
      if (breaker.open) throw providerUnavailable(breaker.retryAfterSeconds);
      const created = await subject.create(acquired.key.id);
      if ('refusal' in created) {
        const response = problemResponse(created.refusal);
        this.phases.complete(acquired.key.id, response);
        return { answer: { response, replayed: false } };
      }
      // This holder calls the provider only before its lease ends: the bound every later decision waits out.
      this.attempts.firstAttempt(subject.table, created.row.id, acquired.key.id);
      this.phases.setRecoveryPoint(acquired.key, subject.created);
      return { key: acquired.key, resumed: false, row: created.row };
    });
  }

  /**
   * Phases 2 and 3. A resumed key first asks the provider what became of the row (a lookup is cheap and never
   * delayed); only if it has nothing is the call sent again, under the same outbound key — which the provider
   * dedupes with an earlier attempt that lands late. Past the re-send window (ProviderAttempts.mayResend) it sends
   * nothing and decides by lookups, as the reconciler does. An unknown outcome releases the lease and answers 503: NOT stored.
   */
  private async callAndSettle<Row extends PhasedRow>(
    subject: PhasedSubject<Row>,
    phase1: Exclude<Phase1<Row>, { answer: KeyAnswer }>,
  ): Promise<StoredResponse> {
    const { key, resumed } = phase1;
    // Only this holder can have moved a row it has just inserted (it holds the lease, and nothing was sent yet).
    const row = phase1.resumed ? (await subject.load(phase1.id))[0] : phase1.row;
    const what = subject.table === 'payments' ? 'payment' : 'refund';
    if (resumed && row.status === 'pending' && !this.attempts.mayResend(row.created_at)) {
      const decided = await this.reconciler.decide(key);
      if (decided) return decided.response;
      throw paymentPending(row.id, what);
    }
    let outcome: ProviderOutcome | undefined;
    if (resumed) {
      outcome = await subject.find(row).catch((err: unknown) => {
        if (err instanceof PspUnreachableError) return undefined;
        throw err;
      });
    }
    if (!outcome && row.status === 'pending' && (!resumed || (await this.attempts.resending(subject.table, row.id, key)))) {
      outcome = await subject.send(row, key.deadline, resumed);
    }
    if (!outcome && row.status === 'pending') {
      await this.attempts.gaveUp(row.id, key);
      throw paymentPending(row.id, what);
    }
    // A row settled meanwhile (a webhook) is answered from the row by the settlement.
    const settled = await subject.settle(row.id, outcome ?? subject.recorded(row), key.leaseToken);
    if (settled.kind === 'lost') throw paymentPending(row.id, what);
    return settled.response;
  }
}
