import { parseHttpDate, parseRetryAfter, RETRY_AFTER_CAP_MS } from './retry-after.js';

const NOW = Date.UTC(1994, 10, 6, 8, 49, 30); // 7 s before the RFC's example date

describe('parseRetryAfter', () => {
  it('reads delta-seconds', () => {
    expect(parseRetryAfter('1', NOW)).toBe(1000);
    expect(parseRetryAfter(' 0 ', NOW)).toBe(0);
    expect(parseRetryAfter('30', NOW)).toBe(30_000);
  });

  it('caps long and absurd values instead of overflowing a timer', () => {
    expect(parseRetryAfter('3600', NOW)).toBe(RETRY_AFTER_CAP_MS);
    expect(parseRetryAfter('9'.repeat(400), NOW)).toBe(RETRY_AFTER_CAP_MS);
  });

  it('reads the three HTTP-date forms as time from now', () => {
    expect(parseRetryAfter('Sun, 06 Nov 1994 08:49:37 GMT', NOW)).toBe(7000);
    expect(parseRetryAfter('Sunday, 06-Nov-94 08:49:37 GMT', NOW)).toBe(7000);
    expect(parseRetryAfter('Sun Nov  6 08:49:37 1994', NOW)).toBe(7000);
  });

  it('treats a date in the past as now, and a far one as the cap', () => {
    expect(parseRetryAfter('Sun, 06 Nov 1994 08:00:00 GMT', NOW)).toBe(0);
    expect(parseRetryAfter('Mon, 07 Nov 1994 08:49:37 GMT', NOW)).toBe(RETRY_AFTER_CAP_MS);
  });

  it('ignores what is absent or not a Retry-After value', () => {
    for (const bad of [null, undefined, '', '-1', '1.5', '1, 2', '0x10', 'soon', '2024-01-01', 'Sun, 06 Nov 1994 08:49:37 +0100']) {
      expect(parseRetryAfter(bad, NOW)).toBeUndefined();
    }
  });
});

describe('parseHttpDate', () => {
  it('refuses dates that do not exist rather than rolling them over', () => {
    expect(parseHttpDate('Tue, 31 Feb 1994 08:49:37 GMT', NOW)).toBeUndefined();
    expect(parseHttpDate('Sun, 06 Nov 1994 24:00:00 GMT', NOW)).toBeUndefined();
  });

  it('reads a two-digit rfc850 year as the most recent past one beyond 50 years ahead', () => {
    const in2030 = Date.UTC(2030, 0, 1);
    expect(new Date(parseHttpDate('Monday, 01-Jan-79 00:00:00 GMT', in2030)!).getUTCFullYear()).toBe(2079);
    expect(new Date(parseHttpDate('Monday, 01-Jan-81 00:00:00 GMT', in2030)!).getUTCFullYear()).toBe(1981);
  });
});
