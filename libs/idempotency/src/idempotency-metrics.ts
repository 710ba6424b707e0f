import { Logger } from '@nestjs/common';

export type IdempotencyOutcome = 'executed' | 'replayed' | 'waited' | 'conflict' | 'mismatch' | 'missing';

/** A prom-client `Registry`, as far as the layer needs to know: prom-client is loaded only when one is given. */
export interface PrometheusRegistry {
  getSingleMetric(name: string): unknown;
}

/** The instruments the layer updates: prom-client's Counter, Histogram and Gauge, or nothing at all without a registry. */
interface Instruments {
  requests: { inc(labels: { outcome: IdempotencyOutcome }): void };
  messages: { inc(labels: { consumer: string; outcome: string }): void };
  wait: { observe(seconds: number): void };
  waiting: { inc(): void; dec(): void };
  held: { inc(labels: { consumer: string }): void; dec(labels: { consumer: string }): void };
}

interface MetricConfig {
  name: string;
  help: string;
  labelNames?: string[];
  buckets?: number[];
  registers: PrometheusRegistry[];
}

/** prom-client's constructors, typed here: the package is optional, so an app without it compiles without its types. */
interface PromClient {
  Counter: new (config: MetricConfig) => Instruments['requests'] & Instruments['messages'];
  Histogram: new (config: MetricConfig) => Instruments['wait'];
  Gauge: new (config: MetricConfig) => Instruments['waiting'] & Instruments['held'];
}

/** A name in a variable: TypeScript does not resolve it, so the import compiles where prom-client is not installed. */
const PROM_CLIENT = 'prom-client';

const NO_INSTRUMENTS: Instruments = {
  requests: { inc: () => undefined },
  messages: { inc: () => undefined },
  wait: { observe: () => undefined },
  waiting: { inc: () => undefined, dec: () => undefined },
  held: { inc: () => undefined, dec: () => undefined },
};

/** What the Idempotency-Key layer reports: each outcome logged with client and key and counted, and the waits. */
export class IdempotencyMetrics {
  private readonly logger = new Logger('Idempotency');

  private constructor(private readonly instruments: Instruments) {}

  /** With a registry, prom-client's metrics registered in it (prom-client imported now, not before); without, none. */
  static async create(registry: PrometheusRegistry | false): Promise<IdempotencyMetrics> {
    if (!registry) return new IdempotencyMetrics(NO_INSTRUMENTS);
    const { Counter, Gauge, Histogram } = (await import(PROM_CLIENT)) as PromClient;
    const registers = [registry];
    return new IdempotencyMetrics({
      requests: new Counter({
        name: 'idempotency_requests_total',
        help: 'Requests on idempotent endpoints by outcome: executed, replayed, waited (for the request in flight, then replayed), conflict (409, still in flight), mismatch (422), missing (400)',
        labelNames: ['outcome'],
        registers,
      }),
      messages: new Counter({
        name: 'idempotent_messages_total',
        help: 'Messages handled by @IdempotentMessage consumers, by outcome: applied, duplicate (mark found: acked, no effect), retried, dead-lettered, dropped (its channel closed while it was held: the broker delivers it again)',
        labelNames: ['consumer', 'outcome'],
        registers,
      }),
      wait: new Histogram({
        name: 'idempotency_wait_seconds',
        help: 'Time a duplicate spent waiting for the request in flight with the same key',
        buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
        registers,
      }),
      waiting: new Gauge({
        name: 'idempotency_waiting_requests',
        help: 'Duplicates waiting in this process, in memory, for an earlier request with the same key to finish',
        registers,
      }),
      held: new Gauge({
        name: 'idempotent_messages_held',
        help: 'Deliveries an @IdempotentMessage consumer holds unsettled while the database is unavailable (at most its prefetch per channel)',
        labelNames: ['consumer'],
        registers,
      }),
    });
  }

  /** A message handler's outcome (`@IdempotentMessage`), counted per consumer. */
  noteMessage(consumer: string, outcome: string): void {
    this.instruments.messages.inc({ consumer, outcome });
  }

  /** Deliveries held (unsettled, tried again) while the database is unavailable, per consumer. */
  get held(): Instruments['held'] {
    return this.instruments.held;
  }

  get wait(): Instruments['wait'] {
    return this.instruments.wait;
  }

  get waiting(): Instruments['waiting'] {
    return this.instruments.waiting;
  }

  /** The one way an outcome is reported, by the interceptor and by any guard that answers for it. */
  note(outcome: IdempotencyOutcome, clientId: string | undefined, key: string | undefined): void {
    this.instruments.requests.inc({ outcome });
    // The success path (executed, replayed) at debug, refusals at log: a service at info writes nothing per successful
    // request. Only built when written (Nest's levels; an app sets them to its own): assembled and handed to a logger
    // that drops it, the line was 2 % of a create's JavaScript in a profile of the bench's create row.
    const level = outcome === 'executed' || outcome === 'replayed' ? 'debug' : 'log';
    if (!Logger.isLevelEnabled(level)) return;
    // A plain message: Nest's default logger prints it on one line, and a structured logger still gets it whole.
    this.logger[level](`idempotency ${outcome}: client ${clientId ?? '-'}, key ${key ?? '-'}`);
  }
}
