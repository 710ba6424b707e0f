import { Logger } from '@nestjs/common';
import { circuitBreaker, CircuitState, ConsecutiveBreaker, type CircuitBreakerPolicy, handleAll } from 'cockatiel';
import type { AttemptResult } from './attempt-result.js';

export type BreakerName = 'charges' | 'lookups';

export type BreakerCheck = { open: true; retryAfterSeconds: number } | { open: false };

/** Exported as psp_breaker_state: 0 closed, 1 half-open (the next call is let through as a probe), 2 open. */
export type BreakerGauge = 0 | 1 | 2;

/**
 * A cockatiel circuit breaker around a whole logical call (every attempt of it): a call whose
 * outcome stayed unknown is one failure, and `threshold` of them in a row open the breaker for
 * `halfOpenMs`. Declines and refusals are answers, so they count as successes: the provider works.
 */
export class PspBreaker {
  readonly policy: CircuitBreakerPolicy;
  // cockatiel keeps its own opening time private; onBreak fires in the same tick, so this matches it.
  private openedAt = 0;
  private readonly logger = new Logger('PspClient');

  constructor(
    readonly name: BreakerName,
    private readonly halfOpenMs: number,
    threshold: number,
    /** The API client whose test-token calls alone this breaker counts (ClientBreakers); undefined for a shared breaker. */
    readonly owner?: string,
  ) {
    // Every error that escapes the retry is a bug on our side after a request may have been sent:
    // it counts as a failure too, as its outcome is as unknown as a timeout's.
    const failure = handleAll.orWhenResult((r) => (r as AttemptResult).verdict === 'unknown');
    this.policy = circuitBreaker(failure, { halfOpenAfter: halfOpenMs, breaker: new ConsecutiveBreaker(threshold) });
    const fields = { breaker: name, ...(owner === undefined ? {} : { clientId: owner, testTokens: true }) };
    this.policy.onBreak(() => {
      this.openedAt = Date.now();
      this.logger.warn({ ...fields, state: 'open', halfOpenAfterMs: halfOpenMs }, 'psp circuit breaker opened');
    });
    this.policy.onHalfOpen(() => this.logger.log({ ...fields, state: 'half-open' }, 'psp circuit breaker half-open: probing'));
    this.policy.onReset(() => this.logger.log({ ...fields, state: 'closed' }, 'psp circuit breaker closed'));
  }

  /**
   * Whether a call made now would be turned away without contacting the provider. Once
   * `halfOpenMs` has passed the answer is "closed", so the next caller goes ahead and becomes the
   * probe (cockatiel moves to half-open only when called). While that probe runs, others are turned
   * away: only one call at a time tests a provider that was down.
   */
  check(now = Date.now()): BreakerCheck {
    switch (this.policy.state) {
      case CircuitState.Open: {
        const left = this.openedAt + this.halfOpenMs - now;
        return left > 0 ? { open: true, retryAfterSeconds: Math.max(1, Math.ceil(left / 1000)) } : { open: false };
      }
      case CircuitState.HalfOpen:
      case CircuitState.Isolated:
        // The probe's answer comes within its own deadline; a second is a fair "ask again".
        return { open: true, retryAfterSeconds: 1 };
      default:
        return { open: false };
    }
  }

  /**
   * Open right now. Seen from inside a call (which was let in closed or as the probe), it means
   * other calls opened it meanwhile: the call stops retrying instead of adding load.
   */
  get isOpen(): boolean {
    return this.policy.state === CircuitState.Open;
  }

  gauge(now = Date.now()): BreakerGauge {
    switch (this.policy.state) {
      case CircuitState.Closed:
        return 0;
      case CircuitState.HalfOpen:
        return 1;
      default:
        return this.check(now).open ? 2 : 1;
    }
  }
}

/**
 * Far more API clients than API_KEYS ever names (they are authenticated, so their ids are not a stranger's choice):
 * a bound on memory, not a limit anybody meets.
 */
export const MAX_CLIENT_BREAKERS = 1_000;

/**
 * One breaker per API client, for the calls that carry one of the sandbox's fault tokens (PspClient), created closed on
 * a client's first such call. Past `limit` clients the one used least recently is forgotten, and its state with it.
 */
export class ClientBreakers {
  // A Map iterates in insertion order: re-inserting on every use keeps the least recently used first.
  private readonly byClient = new Map<string, PspBreaker>();

  constructor(
    private readonly name: BreakerName,
    private readonly halfOpenMs: number,
    private readonly threshold: number,
    private readonly limit = MAX_CLIENT_BREAKERS,
  ) {}

  get size(): number {
    return this.byClient.size;
  }

  of(clientId: string): PspBreaker {
    const breaker = this.byClient.get(clientId) ?? new PspBreaker(this.name, this.halfOpenMs, this.threshold, clientId);
    this.byClient.delete(clientId);
    this.byClient.set(clientId, breaker);
    if (this.byClient.size > this.limit) this.byClient.delete(this.byClient.keys().next().value!);
    return breaker;
  }
}
