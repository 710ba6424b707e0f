/**
 * The sandbox's test cards (docs/contract.md#test-tokens). A token decides the outcome of a
 * charge and of every refund of it, and the faults a real provider shows: failed attempts,
 * answers that come too late, answers that never come in time.
 */
export type Fault =
  /** Answers at once. */
  | 'none'
  /** 503 on the first FLAKY_FAILURES attempts per Idempotency-Key (nothing recorded), then as tok_visa. */
  | 'flaky'
  /** Records at once; the first attempt per key is answered after 3 × PSP_TIMEOUT_MS, later attempts at once. */
  | 'timeout'
  /** Records as succeeded; every answer comes after 3 × PSP_TIMEOUT_MS: only a lookup (or a webhook) can tell. */
  | 'lost'
  /** 503 always, nothing recorded. */
  | 'unavailable'
  /** Every answer comes after PSP_TIMEOUT_MS / 2: slow, but within the client's timeout. */
  | 'slow'
  /**
   * Every request is worked on for PSP_TIMEOUT_MS / 2 before anything is recorded (no charge, no webhook event yet),
   * then answered at once: a payment that is observably in flight for that long, and that nothing settles meanwhile.
   */
  | 'processing';

export interface TestToken {
  charge: 'succeeded' | 'declined';
  refund: 'succeeded' | 'declined';
  fault: Fault;
}

export const TEST_TOKENS: Readonly<Record<string, TestToken>> = {
  tok_visa: { charge: 'succeeded', refund: 'succeeded', fault: 'none' },
  tok_chargeDeclined: { charge: 'declined', refund: 'succeeded', fault: 'none' },
  tok_refundDeclined: { charge: 'succeeded', refund: 'declined', fault: 'none' },
  tok_flaky: { charge: 'succeeded', refund: 'succeeded', fault: 'flaky' },
  tok_timeout: { charge: 'succeeded', refund: 'succeeded', fault: 'timeout' },
  tok_lost: { charge: 'succeeded', refund: 'succeeded', fault: 'lost' },
  tok_unavailable: { charge: 'succeeded', refund: 'succeeded', fault: 'unavailable' },
  tok_slow: { charge: 'succeeded', refund: 'succeeded', fault: 'slow' },
  tok_processing: { charge: 'succeeded', refund: 'succeeded', fault: 'processing' },
};

export const TEST_TOKEN_NAMES = Object.keys(TEST_TOKENS);

/**
 * Whether `source` is a token whose charge (and every refund of it) simulates a provider's fault or delay: the outcome
 * its caller chose, not the provider's state (src/psp-client counts such calls against the caller's own breaker).
 */
export function simulatesFault(source: string): boolean {
  const token = testToken(source);
  return token !== undefined && token.fault !== 'none';
}

/** tok_flaky fails this many attempts per key: enough to make a client retry twice, fewer than PSP_MAX_ATTEMPTS (≥ 3). */
export const FLAKY_FAILURES = 2;

/** The token behind `source`, or undefined when the provider does not know it (400). */
export function testToken(source: string): TestToken | undefined {
  return Object.hasOwn(TEST_TOKENS, source) ? TEST_TOKENS[source] : undefined;
}

/**
 * How long the answer to a recorded charge or refund is held back. `firstAttempt` is true for
 * the request that recorded it, false for a replay of its key. 3 × the client's timeout makes
 * sure every attempt of the client times out; half of it is slow but in time.
 */
export function answerDelayMs(fault: Fault, firstAttempt: boolean, timeoutMs: number): number {
  switch (fault) {
    case 'timeout':
      return firstAttempt ? 3 * timeoutMs : 0;
    case 'lost':
      return 3 * timeoutMs;
    case 'slow':
      return Math.floor(timeoutMs / 2);
    default:
      return 0;
  }
}

/** How long a request is worked on before it is recorded (tok_processing): half the client's timeout, so it is in time. */
export function processingDelayMs(fault: Fault, timeoutMs: number): number {
  return fault === 'processing' ? Math.floor(timeoutMs / 2) : 0;
}
