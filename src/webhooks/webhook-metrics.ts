import { Injectable } from '@nestjs/common';
import { Counter, Registry } from 'prom-client';

@Injectable()
export class WebhookMetrics {
  readonly events: Counter<'outcome'>;

  constructor(registry: Registry) {
    this.events = new Counter({
      name: 'webhook_events_total',
      help:
        'Provider webhook deliveries: received (every one), then rejected (401, bad signature), duplicate (already processed), ' +
        'applied, no_effect (recorded, nothing to change), or failed (5xx, nothing recorded: the provider redelivers)',
      labelNames: ['outcome'],
      registers: [registry],
    });
  }
}
