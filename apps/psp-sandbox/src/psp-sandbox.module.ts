import { type DynamicModule, Module } from '@nestjs/common';
import { AnswerDelays } from './answer-delays.js';
import { ProviderKeyGuard } from './provider-key.guard.js';
import { PspSandboxController } from './psp-sandbox.controller.js';
import { PspSandboxService } from './psp-sandbox.service.js';
import { SandboxDatabase } from './sandbox-database.js';
import { SANDBOX_OPTIONS, type SandboxOptions } from './sandbox-options.js';
import { WebhookMetrics } from './webhook-metrics.js';
import { WebhookRelay } from './webhook-relay.js';

/**
 * The sandbox payment provider under /psp: imported by AppModule when PSP_BASE_URL is unset
 * (the service then calls it over real HTTP, on its own port), or run alone by `npm run psp`.
 * Dev/test only. Its webhooks leave through the outbox relay (webhook-relay.ts).
 */
@Module({})
export class PspSandboxModule {
  static forRoot(options: SandboxOptions): DynamicModule {
    return {
      module: PspSandboxModule,
      controllers: [PspSandboxController],
      providers: [
        { provide: SANDBOX_OPTIONS, useValue: options },
        ProviderKeyGuard,
        SandboxDatabase,
        AnswerDelays,
        PspSandboxService,
        WebhookMetrics,
        WebhookRelay,
      ],
    };
  }
}
