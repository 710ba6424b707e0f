import { Module } from '@nestjs/common';
import { APP_INTERCEPTOR } from '@nestjs/core';
import { AtomicPhases } from './atomic-phases.js';
import { IdempotencyInterceptor } from './idempotency.interceptor.js';
import { IdempotencyKeyReaper } from './idempotency-key-reaper.js';
import { IdempotencyKeysService } from './idempotency-keys.service.js';
import { IdempotencyMetrics } from './idempotency-metrics.js';

@Module({
  providers: [
    IdempotencyKeysService,
    IdempotencyMetrics,
    IdempotencyKeyReaper,
    AtomicPhases,
    // Global, and inert on routes without @Idempotent().
    { provide: APP_INTERCEPTOR, useClass: IdempotencyInterceptor },
  ],
  exports: [IdempotencyKeysService, IdempotencyMetrics, AtomicPhases],
})
export class IdempotencyModule {}
