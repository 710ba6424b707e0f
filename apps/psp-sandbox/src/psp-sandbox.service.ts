import { Inject, Injectable } from '@nestjs/common';
import { randomBytes } from 'node:crypto';
import { fingerprintRequest } from '@idempotent-orders/idempotency';
import type { ChargeMetadataDto, CreateChargeDto } from './dto/create-charge.dto.js';
import type { CreateRefundDto } from './dto/create-refund.dto.js';
import type { PspChargeList, PspChargeView } from './dto/psp-charge.view.js';
import type { PspRefundView } from './dto/psp-refund.view.js';
import {
  chargeNotFound,
  chargeNotRefundable,
  invalidQuery,
  keyReused,
  pspUnavailable,
  refundExceedsCharge,
  unknownSource,
} from './psp-problems.js';
import { SandboxDatabase, type SandboxClient } from './sandbox-database.js';
import { SANDBOX_OPTIONS, type SandboxOptions } from './sandbox-options.js';
import { AnswerDelays } from './answer-delays.js';
import { answerDelayMs, FLAKY_FAILURES, processingDelayMs, type TestToken, testToken } from './test-tokens.js';
import { enqueueWebhookEvent } from './webhook-outbox.js';

/** What to send: the recorded status and body, byte for byte, after `delayMs`. */
export interface ProviderAnswer {
  status: number;
  body: string;
  replayed: boolean;
  delayMs: number;
}

interface StoredKey {
  fingerprint: string;
  response_status: number;
  response_body: string;
}

interface ChargeRow {
  id: string;
  status: 'succeeded' | 'failed';
  amount_minor: string;
  currency: string;
  source: string;
  failure_code: string | null;
  order_id: string;
  payment_id: string;
  deployment_id: string | null;
  created_at: Date;
}

interface RefundRow {
  id: string;
  status: 'succeeded' | 'failed';
  charge_id: string;
  amount_minor: string;
  failure_code: string | null;
  refund_id: string;
  payment_id: string;
  created_at: Date;
}

const CHARGE_COLUMNS = 'id, status, amount_minor, currency, source, failure_code, order_id, payment_id, deployment_id, created_at';
const REFUND_COLUMNS = 'id, status, charge_id, amount_minor, failure_code, refund_id, payment_id, created_at';

/** `pg` returns BIGINT as a string; the CHECKs keep every amount within 2^53, so Number is exact. */
export function chargeView(row: ChargeRow): PspChargeView {
  return {
    id: row.id,
    status: row.status,
    amountMinor: Number(row.amount_minor),
    currency: row.currency,
    source: row.source,
    failureCode: row.failure_code,
    metadata: chargeMetadata(row.order_id, row.payment_id, row.deployment_id ?? undefined),
    createdAt: row.created_at.toISOString(),
  };
}

/** The metadata as the client gave it: a charge made without a deploymentId has none. */
const chargeMetadata = (orderId: string, paymentId: string, deploymentId: string | undefined): ChargeMetadataDto =>
  deploymentId === undefined ? { orderId, paymentId } : { orderId, paymentId, deploymentId };

export function refundView(row: RefundRow): PspRefundView {
  return {
    id: row.id,
    status: row.status,
    chargeId: row.charge_id,
    amountMinor: Number(row.amount_minor),
    failureCode: row.failure_code,
    metadata: { refundId: row.refund_id, paymentId: row.payment_id },
    createdAt: row.created_at.toISOString(),
  };
}

/** "ch_…" / "re_…" + 96 random bits: unguessable, and never repeated in practice. */
const newId = (prefix: 'ch' | 're') => `${prefix}_${randomBytes(12).toString('hex')}`;

/**
 * The provider's side of a charge or refund, done the way a real provider does it: the key, the
 * effect and the answer are committed in ONE transaction before anything is sent, so a retry of
 * the key — concurrent or days later — gets that same answer and never a second effect.
 */
@Injectable()
export class PspSandboxService {
  constructor(
    private readonly db: SandboxDatabase,
    @Inject(SANDBOX_OPTIONS) private readonly options: SandboxOptions,
    private readonly delays: AnswerDelays,
  ) {}

  /** Undefined when the client hung up (or the app closed) while its request was worked on: nothing was recorded. */
  async createCharge(key: string, body: CreateChargeDto, clientGone: AbortSignal): Promise<ProviderAnswer | undefined> {
    const token = testToken(body.source);
    if (!token) throw unknownSource(body.source);
    await this.injectFailures(token, key);
    if (!(await this.workOn(token, clientGone))) return undefined;
    const fingerprint = fingerprintRequest('POST', '/psp/charges', body);
    const declined = token.charge === 'declined';
    const charge: PspChargeView = {
      id: newId('ch'),
      status: declined ? 'failed' : 'succeeded',
      amountMinor: body.amountMinor,
      currency: body.currency,
      source: body.source,
      failureCode: declined ? 'card_declined' : null,
      metadata: chargeMetadata(body.metadata.orderId, body.metadata.paymentId, body.metadata.deploymentId),
      createdAt: new Date().toISOString(),
    };
    const answer = { status: declined ? 402 : 201, body: JSON.stringify(charge) };
    const stored = await this.db.transaction(async (client) => {
      const existing = await this.claimKey(client, key, fingerprint, answer);
      if (existing) return existing;
      await client.query(
        `INSERT INTO psp.charges (id, idempotency_key, status, amount_minor, currency, source, failure_code, order_id, payment_id, deployment_id, created_at)
         VALUES ($1, $2, $3, $4::bigint, $5, $6, $7, $8::uuid, $9::uuid, $10, $11::timestamptz)`,
        [
          charge.id,
          key,
          charge.status,
          charge.amountMinor,
          charge.currency,
          charge.source,
          charge.failureCode,
          charge.metadata.orderId,
          charge.metadata.paymentId,
          charge.metadata.deploymentId ?? null,
          charge.createdAt,
        ],
      );
      // The event commits with the charge or not at all (a replay above returned before this: one charge, one event).
      await enqueueWebhookEvent(
        client,
        declined ? 'charge.failed' : 'charge.succeeded',
        {
          chargeId: charge.id,
          paymentId: charge.metadata.paymentId,
          orderId: charge.metadata.orderId,
          ...(charge.metadata.deploymentId === undefined ? {} : { deploymentId: charge.metadata.deploymentId }),
          amountMinor: charge.amountMinor,
          currency: charge.currency,
          status: charge.status,
          ...(charge.failureCode ? { failureCode: charge.failureCode } : {}),
        },
        this.options.webhooks.duplicates,
      );
      return undefined;
    });
    return this.answer(stored ?? { ...answer, replayed: false }, fingerprint, token);
  }

  /** Undefined as for createCharge. */
  async createRefund(key: string, body: CreateRefundDto, clientGone: AbortSignal): Promise<ProviderAnswer | undefined> {
    // order_id and currency never change once recorded: the refund's event can take them from here.
    const [charge] = await this.db.query<{ status: string; source: string; order_id: string; currency: string }>(
      `SELECT status, source, order_id, currency FROM psp.charges WHERE id = $1`,
      [body.chargeId],
    );
    if (!charge) throw chargeNotFound(body.chargeId);
    // A refund inherits its charge's token: its outcome and its faults. Recorded charges only carry known tokens.
    const token = testToken(charge.source)!;
    await this.injectFailures(token, key);
    if (!(await this.workOn(token, clientGone))) return undefined;
    const fingerprint = fingerprintRequest('POST', '/psp/refunds', body);
    const declined = token.refund === 'declined';
    const refund: PspRefundView = {
      id: newId('re'),
      status: declined ? 'failed' : 'succeeded',
      chargeId: body.chargeId,
      amountMinor: body.amountMinor,
      failureCode: declined ? 'refund_declined' : null,
      metadata: { refundId: body.metadata.refundId, paymentId: body.metadata.paymentId },
      createdAt: new Date().toISOString(),
    };
    const answer = { status: declined ? 402 : 201, body: JSON.stringify(refund) };
    const stored = await this.db.transaction(async (client) => {
      // The key first: a replay answers as before even when nothing remains to refund now.
      const existing = await this.claimKey(client, key, fingerprint, answer);
      if (existing) return existing;
      // One conditional UPDATE reserves the amount, under the charge's row lock: parallel refunds
      // queue on it and each re-checks the WHERE against the committed total, so together they can
      // never exceed the charge (the CHECK on refunded_minor is the backstop). A declined refund
      // takes nothing but is still refused when it asks for more than remains.
      const reserved = await client.query(
        `UPDATE psp.charges SET refunded_minor = refunded_minor + CASE WHEN $3::boolean THEN $2::bigint ELSE 0 END
         WHERE id = $1 AND status = 'succeeded' AND refunded_minor + $2::bigint <= amount_minor`,
        [body.chargeId, body.amountMinor, !declined],
      );
      if (reserved.rowCount === 0) {
        // Throwing rolls the key claim back: a refused refund records nothing.
        const [now] = (
          await client.query<{ status: string; remaining: string }>(
            `SELECT status, amount_minor - refunded_minor AS remaining FROM psp.charges WHERE id = $1`,
            [body.chargeId],
          )
        ).rows;
        if (now.status !== 'succeeded') throw chargeNotRefundable(body.chargeId);
        throw refundExceedsCharge(body.chargeId, Number(now.remaining));
      }
      await client.query(
        `INSERT INTO psp.refunds (id, idempotency_key, charge_id, status, amount_minor, failure_code, refund_id, payment_id, created_at)
         VALUES ($1, $2, $3, $4, $5::bigint, $6, $7::uuid, $8::uuid, $9::timestamptz)`,
        [
          refund.id,
          key,
          refund.chargeId,
          refund.status,
          refund.amountMinor,
          refund.failureCode,
          refund.metadata.refundId,
          refund.metadata.paymentId,
          refund.createdAt,
        ],
      );
      await enqueueWebhookEvent(
        client,
        declined ? 'refund.failed' : 'refund.succeeded',
        {
          providerRefundId: refund.id,
          refundId: refund.metadata.refundId,
          chargeId: refund.chargeId,
          paymentId: refund.metadata.paymentId,
          orderId: charge.order_id,
          amountMinor: refund.amountMinor,
          currency: charge.currency,
          status: refund.status,
          ...(refund.failureCode ? { failureCode: refund.failureCode } : {}),
        },
        this.options.webhooks.duplicates,
      );
      return undefined;
    });
    return this.answer(stored ?? { ...answer, replayed: false }, fingerprint, token);
  }

  async findCharges(filter: { orderId?: string; paymentId?: string }): Promise<PspChargeView[]> {
    const rows = await this.db.query<ChargeRow>(
      `SELECT ${CHARGE_COLUMNS} FROM psp.charges
       WHERE ($1::uuid IS NULL OR order_id = $1::uuid) AND ($2::uuid IS NULL OR payment_id = $2::uuid)
       ORDER BY created_at, id`,
      [filter.orderId ?? null, filter.paymentId ?? null],
    );
    return rows.map(chargeView);
  }

  /**
   * A page of the charges created after `createdAfter`, in (created_at, id) order; with `startingAfter`, those after that
   * charge. Keyset, so a page deep in the listing costs what the first does (ix_psp_charges_created_at_id). created_at is
   * taken before the charge's transaction commits: a charge can appear behind a page already read, so a sweep reads
   * again from a little before where it last began.
   */
  async listCharges(page: { createdAfter: string; startingAfter?: string; limit: number }): Promise<PspChargeList> {
    let from = `created_at > $1::timestamptz`;
    let bound = page.createdAfter;
    if (page.startingAfter !== undefined) {
      const [cursor] = await this.db.query<{ later: boolean }>(
        `SELECT created_at > $2::timestamptz AS later FROM psp.charges WHERE id = $1`,
        [page.startingAfter, page.createdAfter],
      );
      if (!cursor) throw invalidQuery('startingAfter', `there is no charge ${page.startingAfter}`);
      // Only the later of the two bounds matters; one condition lets the index scan start right at it. The cursor's
      // created_at is read in SQL, at full precision: a JavaScript Date would cut microseconds and repeat or skip a charge.
      if (cursor.later) {
        from = `(created_at, id) > (SELECT created_at, id FROM psp.charges WHERE id = $1)`;
        bound = page.startingAfter;
      }
    }
    // One row more than the page: whether it exists is hasMore.
    const rows = await this.db.query<ChargeRow>(
      `SELECT ${CHARGE_COLUMNS} FROM psp.charges WHERE ${from} ORDER BY created_at, id LIMIT $2`,
      [bound, page.limit + 1],
    );
    return { items: rows.slice(0, page.limit).map(chargeView), hasMore: rows.length > page.limit };
  }

  async findRefunds(filter: { chargeId?: string; refundId?: string }): Promise<PspRefundView[]> {
    const rows = await this.db.query<RefundRow>(
      `SELECT ${REFUND_COLUMNS} FROM psp.refunds
       WHERE ($1::text IS NULL OR charge_id = $1::text) AND ($2::uuid IS NULL OR refund_id = $2::uuid)
       ORDER BY created_at, id`,
      [filter.chargeId ?? null, filter.refundId ?? null],
    );
    return rows.map(refundView);
  }

  /** 503 for the tokens that fail before anything is recorded. tok_flaky counts its attempts per key durably and atomically. */
  private async injectFailures(token: TestToken, key: string): Promise<void> {
    if (token.fault === 'unavailable') throw pspUnavailable();
    if (token.fault !== 'flaky') return;
    const [{ attempts }] = await this.db.query<{ attempts: number }>(
      `INSERT INTO psp.fault_attempts (idempotency_key, attempts) VALUES ($1, 1)
       ON CONFLICT (idempotency_key) DO UPDATE SET attempts = psp.fault_attempts.attempts + 1
       RETURNING attempts`,
      [key],
    );
    if (attempts <= FLAKY_FAILURES) throw pspUnavailable();
  }

  /**
   * tok_processing's time at work before anything is recorded: until it ends there is no charge, no key and no event, so
   * nothing (a webhook, a lookup) can settle the payment meanwhile. False: the client hung up or the app is closing.
   */
  private workOn(token: TestToken, clientGone: AbortSignal): Promise<boolean> {
    const ms = processingDelayMs(token.fault, this.options.timeoutMs);
    return ms > 0 ? this.delays.wait(ms, clientGone) : Promise.resolve(true);
  }

  /**
   * Claims `key` with the answer this request will give, or returns the answer already recorded.
   * INSERT … ON CONFLICT, never check-then-insert: a concurrent request with the same key blocks
   * on this row until the first transaction ends, then finds it committed and replays it.
   */
  private async claimKey(client: SandboxClient, key: string, fingerprint: string, answer: { status: number; body: string }) {
    const claimed = await client.query(
      `INSERT INTO psp.idempotency_keys (key, fingerprint, response_status, response_body) VALUES ($1, $2, $3, $4)
       ON CONFLICT (key) DO NOTHING`,
      [key, fingerprint, answer.status, answer.body],
    );
    if (claimed.rowCount === 1) return undefined;
    // A new statement: in READ COMMITTED it sees the row the conflicting transaction committed.
    const [stored] = (
      await client.query<StoredKey>(`SELECT fingerprint, response_status, response_body FROM psp.idempotency_keys WHERE key = $1`, [key])
    ).rows;
    if (!stored) throw new Error(`psp idempotency key ${key} conflicted but cannot be read`);
    return { status: stored.response_status, body: stored.response_body, replayed: true, fingerprint: stored.fingerprint };
  }

  private answer(
    recorded: { status: number; body: string; replayed: boolean; fingerprint?: string },
    fingerprint: string,
    token: TestToken,
  ): ProviderAnswer {
    // Same key, other request: refused, and nothing of this request was written.
    if (recorded.fingerprint !== undefined && recorded.fingerprint !== fingerprint) throw keyReused();
    return {
      status: recorded.status,
      body: recorded.body,
      replayed: recorded.replayed,
      delayMs: answerDelayMs(token.fault, !recorded.replayed, this.options.timeoutMs),
    };
  }
}
