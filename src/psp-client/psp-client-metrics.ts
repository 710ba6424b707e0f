import { Injectable } from '@nestjs/common';
import { Counter, Gauge, Registry } from 'prom-client';
import type { PspBreaker } from './psp-breaker.js';

export type PspOperation = 'charge' | 'refund' | 'lookup-charges' | 'lookup-refunds' | 'list-charges';

/** Outcome of one logical call: the PspCallResult kind for writes; ok / refused / unknown / unreachable / breaker-open for lookups. */
export type PspCallOutcome = 'succeeded' | 'declined' | 'refused' | 'unknown' | 'breaker-open' | 'ok' | 'unreachable';

@Injectable()
export class PspClientMetrics {
  readonly attempts: Counter<'operation' | 'result'>;
  readonly calls: Counter<'operation' | 'outcome'>;
  readonly breakerState: Gauge<'breaker'>;
  private readonly breakers: PspBreaker[] = [];

  constructor(registry: Registry) {
    this.attempts = new Counter({
      name: 'psp_attempts_total',
      help: 'HTTP attempts to the payment provider by operation and result (the HTTP status, timeout or network)',
      labelNames: ['operation', 'result'],
      registers: [registry],
    });
    this.calls = new Counter({
      name: 'psp_calls_total',
      help: 'Logical calls to the payment provider (all attempts under one key) by operation and outcome',
      labelNames: ['operation', 'outcome'],
      registers: [registry],
    });
    const breakers = this.breakers;
    this.breakerState = new Gauge({
      name: 'psp_breaker_state',
      help: 'Payment provider circuit breaker: 0 closed, 1 half-open (the next call probes), 2 open',
      labelNames: ['breaker'],
      registers: [registry],
      // Read at scrape time: the move from open to half-open is a matter of time passing, not an event.
      collect() {
        for (const breaker of breakers) this.set({ breaker: breaker.name }, breaker.gauge());
      },
    });
  }

  watch(breaker: PspBreaker): void {
    this.breakers.push(breaker);
  }
}
