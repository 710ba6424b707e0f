import { Module } from '@nestjs/common';
import { PaymentsModule } from '../payments/payments.module.js';
import { ProcessedWebhookEventReaper } from './processed-webhook-event-reaper.js';
import { WebhookMetrics } from './webhook-metrics.js';
import { WebhooksController } from './webhooks.controller.js';
import { WebhooksService } from './webhooks.service.js';

/** PATTERN idempotent consumer: the provider's at-least-once events, each applied once. */
@Module({
  imports: [PaymentsModule],
  controllers: [WebhooksController],
  providers: [WebhooksService, WebhookMetrics, ProcessedWebhookEventReaper],
})
export class WebhooksModule {}
