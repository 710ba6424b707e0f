import { retryDelayMs } from './webhook-relay.js';

describe('retryDelayMs (0.5 s · 2ⁿ, capped at 30 s, minus up to a quarter of jitter)', () => {
  it('doubles from 0.5 s per failure', () => {
    const none = () => 0;
    expect([1, 2, 3, 4, 5, 6].map((n) => retryDelayMs(n, none))).toEqual([500, 1_000, 2_000, 4_000, 8_000, 16_000]);
  });

  it('never exceeds 30 s, even after very many failures', () => {
    for (const failures of [7, 8, 30, 1_000, 1e9]) expect(retryDelayMs(failures, () => 0)).toBe(30_000);
  });

  it('jitter takes away at most a quarter', () => {
    expect(retryDelayMs(1, () => 0.999999)).toBe(375);
    expect(retryDelayMs(100, () => 1)).toBe(22_500);
    for (let i = 0; i < 1_000; i++) {
      const delay = retryDelayMs(3);
      expect(delay).toBeGreaterThanOrEqual(1_500);
      expect(delay).toBeLessThanOrEqual(2_000);
    }
  });
});
