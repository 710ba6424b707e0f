import { attemptFits, planRetry } from './retry-plan.js';

describe('attemptFits', () => {
  it('lets an attempt start only if it ends, timing out, by the deadline', () => {
    expect(attemptFits(1000, 1150, 150)).toBe(true);
    expect(attemptFits(1001, 1150, 150)).toBe(false);
  });
});

describe('planRetry', () => {
  const base = { now: 0, deadline: 10_000, timeoutMs: 1000, backoffMs: 200, retryAfterMs: undefined };

  it('waits the backoff when there is no Retry-After', () => {
    expect(planRetry(base)).toEqual({ retry: true, delayMs: 200 });
  });

  it('waits at least the Retry-After, even when the backoff is shorter', () => {
    expect(planRetry({ ...base, retryAfterMs: 1000 })).toEqual({ retry: true, delayMs: 1000 });
    expect(planRetry({ ...base, backoffMs: 3000, retryAfterMs: 1000 })).toEqual({ retry: true, delayMs: 3000 });
  });

  it('does not wait out a Retry-After that would end after the deadline', () => {
    const plan = planRetry({ ...base, deadline: 1000 + 1000, retryAfterMs: 30_000 });
    expect(plan).toEqual({ retry: false, reason: 'Retry-After of 30 s would end after the deadline' });
  });

  it('accepts a Retry-After that exactly fits', () => {
    expect(planRetry({ ...base, deadline: 3000, retryAfterMs: 2000 })).toEqual({ retry: true, delayMs: 2000 });
  });

  it('shrinks its own backoff to fit the time left', () => {
    expect(planRetry({ ...base, deadline: 1050, backoffMs: 500 })).toEqual({ retry: true, delayMs: 50 });
  });

  it('gives up when not even an immediate attempt would end by the deadline', () => {
    expect(planRetry({ ...base, deadline: 999 })).toEqual({ retry: false, reason: 'the deadline leaves no time for another attempt' });
  });
});
