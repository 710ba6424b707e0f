/** May an attempt start now? Only if it would end, even timing out, by the deadline. */
export function attemptFits(now: number, deadline: number, timeoutMs: number): boolean {
  return now + timeoutMs <= deadline;
}

export type RetryPlan = { retry: true; delayMs: number } | { retry: false; reason: string };

/**
 * When to make the next attempt, if at all. Retry-After is the provider's requirement: if it would
 * push the attempt's end past the deadline we give up now instead of waiting it out. Our own
 * backoff is only courtesy: it shrinks to fit the room left, so the deadline's budget is used.
 */
export function planRetry(p: {
  now: number;
  deadline: number;
  timeoutMs: number;
  backoffMs: number;
  retryAfterMs: number | undefined;
}): RetryPlan {
  // The latest moment, from now, at which another attempt may start.
  const room = p.deadline - p.timeoutMs - p.now;
  if (room < 0) return { retry: false, reason: 'the deadline leaves no time for another attempt' };
  if (p.retryAfterMs !== undefined && p.retryAfterMs > room) {
    return { retry: false, reason: `Retry-After of ${Math.ceil(p.retryAfterMs / 1000)} s would end after the deadline` };
  }
  return { retry: true, delayMs: Math.max(p.retryAfterMs ?? 0, Math.min(p.backoffMs, room)) };
}
