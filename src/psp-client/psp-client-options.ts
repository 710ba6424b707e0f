export interface PspClientOptions {
  /**
   * The provider's base URL including its prefix, e.g. `http://localhost:4000/psp`. A function
   * because the in-process sandbox's URL is known only once the app listens (port 0 in tests).
   */
  baseUrl: () => string;
  /** The provider's secret key (PSP_API_KEY), sent with every attempt as `Authorization: Bearer <key>`. */
  apiKey: string;
  /** Per attempt: connect, headers and body must all arrive within it (PSP_TIMEOUT_MS). */
  timeoutMs: number;
  /** Attempts per logical call, the first included (PSP_MAX_ATTEMPTS). */
  maxAttempts: number;
  /** Consecutive calls with an unknown outcome that open a breaker (PSP_BREAKER_THRESHOLD). */
  breakerThreshold: number;
  /** How long an open breaker turns calls away before letting one probe through (PSP_BREAKER_HALF_OPEN_MS). */
  breakerHalfOpenMs: number;
  /** First backoff between attempts, before jitter; default BACKOFF_INITIAL_MS. Tests shorten it. */
  backoffInitialMs?: number;
  /** Longest backoff between attempts; default BACKOFF_MAX_MS. A longer Retry-After still wins. */
  backoffMaxMs?: number;
}

export const PSP_CLIENT_OPTIONS = Symbol('PSP_CLIENT_OPTIONS');

/**
 * Decorrelated jitter from ~100 ms, each wait at most 1 s: four waits (PSP_MAX_ATTEMPTS = 5) stay
 * near the 2 s that the start-up lease check budgets for backoff beyond the attempts' own timeouts.
 */
export const BACKOFF_INITIAL_MS = 100;
export const BACKOFF_MAX_MS = 1_000;

/**
 * A lookup has no caller deadline: it gets the same budget as the lease check gives a write
 * (every attempt timing out plus 2 s of backoff), so a reconciler run cannot hang on one.
 */
export const LOOKUP_BACKOFF_BUDGET_MS = 2_000;
