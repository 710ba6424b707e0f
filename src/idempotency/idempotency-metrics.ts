import { Injectable } from '@nestjs/common';
import { Counter, Histogram, Registry } from 'prom-client';

export type IdempotencyOutcome = 'executed' | 'replayed' | 'waited' | 'conflict' | 'mismatch' | 'missing';

@Injectable()
export class IdempotencyMetrics {
  readonly requests: Counter<'outcome'>;
  readonly wait: Histogram;

  constructor(registry: Registry) {
    this.requests = new Counter({
      name: 'idempotency_requests_total',
      help: 'Requests on idempotent endpoints by outcome: executed, replayed, waited (for the request in flight, then replayed), conflict (409, still in flight), mismatch (422), missing (400)',
      labelNames: ['outcome'],
      registers: [registry],
    });
    this.wait = new Histogram({
      name: 'idempotency_wait_seconds',
      help: 'Time a duplicate spent waiting for the request in flight with the same key',
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers: [registry],
    });
  }
}
