import { chargeOutcome, foundChargeOutcome, foundRefundOutcome, refundOutcome } from './provider-outcomes.js';

const charge = (status: 'succeeded' | 'failed', failureCode: string | null = null) => ({
  id: `ch_${status}`,
  status,
  amountMinor: 100,
  currency: 'EUR',
  source: 'tok_visa',
  failureCode,
  metadata: { orderId: 'o', paymentId: 'p' },
  createdAt: '2026-11-30T00:00:00.000Z',
});

describe('provider outcomes: what is final and what is not', () => {
  it('a success and a decline are final; a refusal of the request fails the payment with invalid_source', () => {
    expect(chargeOutcome({ kind: 'succeeded', value: charge('succeeded') })).toEqual({ status: 'succeeded', providerId: 'ch_succeeded' });
    expect(chargeOutcome({ kind: 'declined', value: charge('failed', 'card_declined') })).toEqual({
      status: 'failed',
      failureCode: 'card_declined',
      providerId: 'ch_failed',
    });
    expect(chargeOutcome({ kind: 'refused', status: 400, detail: 'unknown token' })).toEqual({
      status: 'failed',
      failureCode: 'invalid_source',
    });
    expect(chargeOutcome({ kind: 'refused', status: 422, detail: 'x' })).toEqual({ status: 'failed', failureCode: 'provider_refused' });
  });

  it('an unknown outcome or an open breaker decides nothing: the payment must stay pending', () => {
    expect(chargeOutcome({ kind: 'unknown', reason: 'timeout' })).toBeUndefined();
    expect(chargeOutcome({ kind: 'breaker-open', retryAfterSeconds: 5 })).toBeUndefined();
    expect(refundOutcome({ kind: 'unknown', reason: '503' })).toBeUndefined();
  });

  it('a refusal after an earlier attempt of the same write (a resumed key) decides nothing: that attempt may still land', () => {
    expect(chargeOutcome({ kind: 'refused', status: 422, detail: 'x' }, true)).toBeUndefined();
    expect(refundOutcome({ kind: 'refused', status: 404, detail: 'x' }, true)).toBeUndefined();
    expect(chargeOutcome({ kind: 'declined', value: charge('failed', 'card_declined') }, true)).toEqual({
      status: 'failed',
      failureCode: 'card_declined',
      providerId: 'ch_failed',
    });
  });

  it('a lookup prefers a succeeded charge, and finding none decides nothing', () => {
    expect(foundChargeOutcome([charge('failed', 'card_declined'), charge('succeeded')])).toEqual({
      status: 'succeeded',
      providerId: 'ch_succeeded',
    });
    expect(foundChargeOutcome([])).toBeUndefined();
    expect(foundRefundOutcome([])).toBeUndefined();
  });
});
