import { answerDelayMs, processingDelayMs, simulatesFault, testToken } from './test-tokens.js';

describe('sandbox test tokens', () => {
  it('holds back answers as docs/contract.md#test-tokens says', () => {
    expect(answerDelayMs('timeout', true, 200)).toBe(600);
    expect(answerDelayMs('timeout', false, 200)).toBe(0);
    expect(answerDelayMs('lost', true, 200)).toBe(600);
    expect(answerDelayMs('lost', false, 200)).toBe(600);
    expect(answerDelayMs('slow', false, 200)).toBe(100);
    expect(answerDelayMs('none', true, 200)).toBe(0);
    expect(answerDelayMs('flaky', true, 200)).toBe(0);
    // tok_processing holds the request before recording it, and its answer not at all.
    expect(processingDelayMs('processing', 200)).toBe(100);
    expect(answerDelayMs('processing', true, 200)).toBe(0);
    expect(processingDelayMs('slow', 200)).toBe(0);
    expect(processingDelayMs('none', 200)).toBe(0);
  });

  it('knows only its own tokens, not inherited object members', () => {
    expect(testToken('tok_visa')?.charge).toBe('succeeded');
    expect(testToken('tok_processing')).toEqual({ charge: 'succeeded', refund: 'succeeded', fault: 'processing' });
    expect(testToken('toString')).toBeUndefined();
    expect(testToken('__proto__')).toBeUndefined();
    expect(testToken('tok_mastercard')).toBeUndefined();
  });

  it('tells the tokens that simulate a fault or a delay from those that answer at once, and from what it does not know', () => {
    const faulty = ['tok_flaky', 'tok_timeout', 'tok_lost', 'tok_unavailable', 'tok_slow', 'tok_processing'];
    expect(faulty.filter(simulatesFault)).toEqual(faulty);
    expect(['tok_visa', 'tok_chargeDeclined', 'tok_refundDeclined', 'tok_mastercard', 'toString'].filter(simulatesFault)).toEqual([]);
  });
});
