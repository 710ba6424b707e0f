import { Logger } from '@nestjs/common';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';

export type IdempotencyOutcome = 'executed' | 'replayed' | 'waited' | 'conflict' | 'mismatch' | 'missing';

/** What the Idempotency-Key layer reports: each outcome logged with client and key and counted, and the waits. */
export class IdempotencyMetrics {
  private readonly logger = new Logger('Idempotency');
  readonly requests: Counter<'outcome'>;
  readonly wait: Histogram;
  readonly waiting: Gauge;

  /** Without a registry the metrics are kept but exported nowhere (IdempotencyModuleOptions.metrics: false). */
  constructor(registry: Registry | false) {
    const registers = registry ? [registry] : [];
    this.requests = new Counter({
      name: 'idempotency_requests_total',
      help: 'Requests on idempotent endpoints by outcome: executed, replayed, waited (for the request in flight, then replayed), conflict (409, still in flight), mismatch (422), missing (400)',
      labelNames: ['outcome'],
      registers,
    });
    this.wait = new Histogram({
      name: 'idempotency_wait_seconds',
      help: 'Time a duplicate spent waiting for the request in flight with the same key',
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers,
    });
    this.waiting = new Gauge({
      name: 'idempotency_waiting_requests',
      help: 'Duplicates waiting in this process, in memory, for an earlier request with the same key to finish',
      registers,
    });
  }

  /** The one way an outcome is reported, by the interceptor and by any guard that answers for it. */
  note(outcome: IdempotencyOutcome, clientId: string | undefined, key: string | undefined): void {
    this.requests.inc({ outcome });
    this.logger.log({ outcome, clientId, idempotencyKey: key }, `idempotency ${outcome}`);
  }
}
