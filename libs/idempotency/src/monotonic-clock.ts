/**
 * Milliseconds on a clock that only moves forward (from process start). Deadlines are measured on it:
 * a wall clock set back (NTP, a VM resumed) would otherwise let an attempt start after its lease ended.
 */
export const monotonicNow = (): number => performance.now();
