import { Module } from '@nestjs/common';
import { AtomicPhases } from './atomic-phases.js';
import { DataSource } from 'typeorm';
import { Database } from './database.js';
import { IdempotencyInterceptor } from './idempotency.interceptor.js';
import { IdempotencyKeyReaper } from './idempotency-key-reaper.js';
import { IdempotencyKeysService } from './idempotency-keys.service.js';
import { IdempotencyMetrics } from './idempotency-metrics.js';
import {
  ConfigurableIdempotencyModule,
  IDEMPOTENCY_MODULE_OPTIONS,
  IDEMPOTENCY_OPTIONS,
  type IdempotencyModuleOptions,
  resolveOptions,
  type ResolvedIdempotencyOptions,
} from './idempotency-options.js';
import { IdempotencyProblems } from './idempotency-problems.js';
import { KeyLines } from './key-lines.js';
import { ReplayCache } from './replay-cache.js';
import { StoredResponseCipher } from './stored-response-cipher.js';

/** Bounds the replay cache's memory whatever the bodies weigh: 10 000 typical answers are a few MB. */
const REPLAY_CACHE_MAX_BYTES = 32 * 1024 * 1024;

/**
 * The Idempotency-Key layer: `IdempotencyModule.forRoot({ callerScope, … })` (or `forRootAsync`)
 * once, beside TypeOrmModule; then `@Idempotent()` on a route. Nothing is registered globally: the
 * decorator brings its interceptor. Its providers (Database, AtomicPhases, …) are injectable in every
 * module, as TypeOrmModule's are (`isGlobal: false` to import it where it is used instead).
 */
@Module({
  providers: [
    {
      provide: IDEMPOTENCY_OPTIONS,
      useFactory: (options: IdempotencyModuleOptions) => resolveOptions(options),
      inject: [IDEMPOTENCY_MODULE_OPTIONS],
    },
    {
      provide: IdempotencyMetrics,
      useFactory: (options: ResolvedIdempotencyOptions) => IdempotencyMetrics.create(options.metrics),
      inject: [IDEMPOTENCY_OPTIONS],
    },
    {
      provide: ReplayCache,
      // With encryption on, the cache holds sealed answers too.
      useFactory: (options: ResolvedIdempotencyOptions, cipher: StoredResponseCipher) =>
        new ReplayCache(options.replayCacheEntries, REPLAY_CACHE_MAX_BYTES, undefined, cipher),
      inject: [IDEMPOTENCY_OPTIONS, StoredResponseCipher],
    },
    {
      // The one thing the layer changes outside itself, and only on this DataSource: its createQueryRunner, so the
      // app's repositories and manager join the open idempotent transaction (docs/use-it-in-your-app.md says so).
      provide: Database,
      useFactory: (dataSource: DataSource, options: ResolvedIdempotencyOptions) => new Database(dataSource, options).attach(),
      inject: [DataSource, IDEMPOTENCY_OPTIONS],
    },
    IdempotencyKeysService,
    IdempotencyProblems,
    IdempotencyKeyReaper,
    KeyLines,
    AtomicPhases,
    IdempotencyInterceptor,
    {
      provide: StoredResponseCipher,
      useFactory: (options: ResolvedIdempotencyOptions) => new StoredResponseCipher(options.responseEncryption, options.problemType),
      inject: [IDEMPOTENCY_OPTIONS],
    },
  ],
  exports: [
    IDEMPOTENCY_OPTIONS,
    Database,
    IdempotencyKeysService,
    IdempotencyMetrics,
    IdempotencyProblems,
    IdempotencyKeyReaper,
    KeyLines,
    ReplayCache,
    StoredResponseCipher,
    AtomicPhases,
    IdempotencyInterceptor,
  ],
})
export class IdempotencyModule extends ConfigurableIdempotencyModule {}
