import type { PspCallResult, PspCharge, PspRefund } from '../psp-client/psp-client.js';
import type { ProviderOutcome } from './payment-settlement.js';

/**
 * A provider's answer about a charge, as the settlement records it; undefined when the outcome is not known.
 * `earlierAttempt`: an attempt of this write before this call (a resumed key's) may still land, so a refusal of
 * this call says nothing about it: unknown, decided by lookups once the landing window has closed.
 */
export function chargeOutcome(result: PspCallResult<PspCharge>, earlierAttempt = false): ProviderOutcome | undefined {
  if (result.kind === 'refused' && earlierAttempt) return undefined;
  switch (result.kind) {
    case 'succeeded':
      return { status: 'succeeded', providerId: result.value.id };
    case 'declined':
      return { status: 'failed', failureCode: result.value.failureCode ?? 'card_declined', providerId: result.value.id };
    case 'refused':
      // The provider refused the request itself (an unknown source): nothing was charged, and asking again cannot change that.
      return { status: 'failed', failureCode: result.status === 400 ? 'invalid_source' : 'provider_refused' };
    default:
      return undefined;
  }
}

/** A charge found by a lookup, as the settlement records it. */
export function foundChargeOutcome(charges: PspCharge[]): ProviderOutcome | undefined {
  const charge = charges.find((c) => c.status === 'succeeded') ?? charges[0];
  if (!charge) return undefined;
  return charge.status === 'succeeded'
    ? { status: 'succeeded', providerId: charge.id }
    : { status: 'failed', failureCode: charge.failureCode ?? 'card_declined', providerId: charge.id };
}

/** A provider's answer about a refund; undefined when the outcome is not known (`earlierAttempt`: as for a charge). */
export function refundOutcome(result: PspCallResult<PspRefund>, earlierAttempt = false): ProviderOutcome | undefined {
  if (result.kind === 'refused' && earlierAttempt) return undefined;
  switch (result.kind) {
    case 'succeeded':
      return { status: 'succeeded', providerId: result.value.id };
    case 'declined':
      return { status: 'failed', failureCode: result.value.failureCode ?? 'refund_declined', providerId: result.value.id };
    case 'refused':
      return { status: 'failed', failureCode: 'provider_refused' };
    default:
      return undefined;
  }
}

/** A refund found by a lookup. */
export function foundRefundOutcome(refunds: PspRefund[]): ProviderOutcome | undefined {
  const refund = refunds.find((r) => r.status === 'succeeded') ?? refunds[0];
  if (!refund) return undefined;
  return refund.status === 'succeeded'
    ? { status: 'succeeded', providerId: refund.id }
    : { status: 'failed', failureCode: refund.failureCode ?? 'refund_declined', providerId: refund.id };
}

/**
 * The outcome already recorded on a payment or refund that is no longer pending (its provider id:
 * `provider_transaction_id` or `provider_refund_id`), for settling it again as it is.
 */
export function recordedOutcome(
  status: 'pending' | 'succeeded' | 'failed',
  providerId: string | null,
  failureCode: string | null,
): ProviderOutcome {
  return status === 'succeeded'
    ? { status: 'succeeded', providerId: providerId! }
    : { status: 'failed', failureCode: failureCode ?? 'unknown', providerId };
}
