import { type DynamicModule, Module } from '@nestjs/common';
import { APP_FILTER } from '@nestjs/core';
import { TypeOrmModule } from '@nestjs/typeorm';
import { writeSync } from 'node:fs';
import { IDEMPOTENT_MESSAGE_DEFAULTS, type IdempotentMessageDefaults } from '@idempotent-orders/idempotency/messages';
import { IdempotencyModule, ProblemDetailsFilter } from '@idempotent-orders/idempotency';
import { BrokerStatus } from './broker-status.js';
import type { FulfilmentConfig } from './config.js';
import { FULFILMENT_CONFIG } from './fulfilment.module-tokens.js';
import { HttpController } from './http.controller.js';
import { createMetricsRegistry, METRICS_REGISTRY } from './metrics.js';
import { OrderEventsController } from './order-events.controller.js';
import { ProcessedMessageReaper } from './processed-message-reaper.js';
import { ShipmentsService } from './shipments.service.js';

/** FULFILMENT_FAULT=die-after-batch-commit (tests only): the crash between a batch's COMMIT and its acks. */
function dieAfterBatchCommit(messageIds: string[]): void {
  // Written synchronously: a buffered line would die with the process.
  writeSync(2, `FULFILMENT_FAULT=die-after-batch-commit: dying before acking ${messageIds.length} committed messages\n`);
  process.kill(process.pid, 'SIGKILL');
}

/**
 * The fulfilment consumer: order events in (RabbitMQ, @IdempotentMessage handlers), shipments out, and a small
 * HTTP side (health, shipments, metrics). Migrations are applied before this module starts (main.ts).
 */
@Module({})
export class FulfilmentModule {
  static forRoot(config: FulfilmentConfig): DynamicModule {
    const registry = createMetricsRegistry();
    return {
      module: FulfilmentModule,
      imports: [
        TypeOrmModule.forRoot({
          type: 'postgres',
          url: config.databaseUrl,
          entities: [],
          synchronize: false,
          migrationsRun: false,
          // The layer sends a transaction's statements together (BEGIN with the claim, the effect, COMMIT).
          extra: { max: config.databasePoolSize, connectionTimeoutMillis: 5_000 },
        }),
        IdempotencyModule.forRoot({
          // HTTP Idempotency-Keys are not used here (no table for them, no reaper): only message marks.
          callerScope: () => undefined,
          reaper: false,
          metrics: registry,
        }),
      ],
      controllers: [OrderEventsController, HttpController],
      providers: [
        ShipmentsService,
        BrokerStatus,
        ProcessedMessageReaper,
        { provide: FULFILMENT_CONFIG, useValue: config },
        { provide: METRICS_REGISTRY, useValue: registry },
        {
          provide: IDEMPOTENT_MESSAGE_DEFAULTS,
          useValue: {
            maxAttempts: config.maxAttempts,
            batch: { size: config.batchSize, waitMs: config.batchWaitMs },
            afterBatchCommit: config.fault === 'die-after-batch-commit' ? dieAfterBatchCommit : undefined,
          } satisfies IdempotentMessageDefaults,
        },
        { provide: APP_FILTER, useClass: ProblemDetailsFilter },
      ],
    };
  }
}
