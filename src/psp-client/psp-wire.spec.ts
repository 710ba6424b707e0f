import { isPspCharge, isPspRefund, problemDetail } from './psp-wire.js';

const charge = {
  id: 'ch_1',
  status: 'succeeded',
  amountMinor: 1250,
  currency: 'EUR',
  source: 'tok_visa',
  failureCode: null,
  metadata: { orderId: 'o', paymentId: 'p' },
  createdAt: '2026-01-01T00:00:00.000Z',
};
const refund = {
  id: 're_1',
  status: 'failed',
  chargeId: 'ch_1',
  amountMinor: 5,
  failureCode: 'refund_declined',
  metadata: { refundId: 'r', paymentId: 'p' },
  createdAt: '2026-01-01T00:00:00.000Z',
};

describe('isPspCharge / isPspRefund', () => {
  it('accepts the contract shapes', () => {
    expect(isPspCharge(charge)).toBe(true);
    expect(isPspRefund(refund)).toBe(true);
  });

  it('refuses records whose stored fields are not what they claim', () => {
    expect(isPspCharge({ ...charge, amountMinor: '1250' })).toBe(false);
    expect(isPspCharge({ ...charge, amountMinor: 12.5 })).toBe(false);
    expect(isPspCharge({ ...charge, status: 'pending' })).toBe(false);
    expect(isPspCharge({ ...charge, metadata: { orderId: 'o' } })).toBe(false);
    expect(isPspCharge(refund)).toBe(false);
    expect(isPspRefund(charge)).toBe(false);
    expect(isPspRefund(null)).toBe(false);
    expect(isPspRefund([refund])).toBe(false);
  });
});

describe('problemDetail', () => {
  it('prefers detail, then title, then the status', () => {
    expect(problemDetail(422, { title: 'Unprocessable', detail: 'Idempotency-Key reused with another body' })).toBe(
      'Idempotency-Key reused with another body',
    );
    expect(problemDetail(404, { title: 'Charge not found' })).toBe('Charge not found');
    expect(problemDetail(400, 'garbage')).toBe('The provider refused the request (HTTP 400).');
  });
});
