import { ConfigurableModuleBuilder, type HttpException } from '@nestjs/common';
import { defaultProblemType } from './idempotency-key-header.js';
import type { PrometheusRegistry } from './idempotency-metrics.js';
import { type Problem, problemOf } from './problem-details.js';
import { type ResolvedResponseEncryption, resolveResponseEncryption, type ResponseEncryption } from './stored-response-cipher.js';

/** What a request looks like to the layer, on Express or Fastify alike. */
export interface IdempotentRequest {
  method: string;
  originalUrl: string;
  headers: Record<string, string | string[] | undefined>;
  body?: unknown;
  /** What an authentication guard (Passport, your own) put on the request: `callerScope: (req) => req.user?.id`. */
  user?: { id?: string; [claim: string]: unknown };
}

export interface IdempotencyModuleOptions {
  /**
   * Who is calling: keys are scoped to it, so two callers may use the same key for different
   * requests. Return undefined when the caller is unknown: the request is refused (401), since a
   * key nobody owns would let one caller replay another's answer.
   */
  callerScope: (request: IdempotentRequest) => string | undefined;
  /** How long a completed key is remembered (and replayed). Default 24 h. */
  ttlSeconds?: number;
  /** How long a duplicate waits for the request in flight with its key before a 409 + Retry-After. Default 5 s. */
  waitMs?: number;
  /** A phased key's lease (AtomicPhases): how long its holder owns it before a retry may take it over. Default 60 s. */
  leaseSeconds?: number;
  /** A lease holder stops calling out this long before its lease ends, so its last write lands inside it. Default 2 s. */
  leaseMarginMs?: number;
  /** Completed keys whose answers are kept in memory for their next replays; 0 turns the cache off. Default 10 000. */
  replayCacheEntries?: number;
  /** Response headers stored with an answer and sent again on replay (lower-case). Never Set-Cookie. */
  replayedHeaders?: readonly string[];
  /** A prom-client `Registry` for the layer's metrics (prom-client is loaded only then), or false for none. Default none. */
  metrics?: PrometheusRegistry | false;
  /** Delete expired keys once a minute (off when several apps share one table and another reaps). Default true. */
  reaper?: boolean;
  /** Named (server-side prepared) statements: set false behind a transaction pooler that cannot keep them. Default true. */
  preparedStatements?: boolean;
  /** The `type` of the layer's own problems, by their slug (`idempotency-key-missing`, …). Default `urn:idempotency:problem:<slug>`. */
  problemType?: (slug: string) => string;
  /**
   * How a business error a handler threw (402, 404, 409, 410, 422) is stored and sent: the same
   * bytes first and on every replay. Default: a problem+json of the exception (its own problem when
   * it is a ProblemDetailsException).
   */
  renderError?: (error: HttpException) => { problem: Problem; headers: Record<string, string> };
  /**
   * Stored answers (and the replay cache's copies) sealed with AES-256-GCM: `{ keys: { k2: …, k1: … }, current: 'k2' }`,
   * 32 random bytes per key. Keep a key in `keys` until the answers it sealed have expired (ttlSeconds). Default off.
   */
  responseEncryption?: ResponseEncryption | false;
}

/** The options with every default filled in: what the layer's services read. */
export interface ResolvedIdempotencyOptions extends Required<Omit<IdempotencyModuleOptions, 'metrics' | 'responseEncryption'>> {
  metrics: PrometheusRegistry | false;
  responseEncryption: ResolvedResponseEncryption | false;
}

export const DEFAULT_REPLAYED_HEADERS = ['content-type', 'location', 'etag', 'retry-after'] as const;

export function resolveOptions(options: IdempotencyModuleOptions): ResolvedIdempotencyOptions {
  if (typeof options.callerScope !== 'function') throw new Error('IdempotencyModule: callerScope (request → caller id) is required');
  return {
    callerScope: options.callerScope,
    ttlSeconds: options.ttlSeconds ?? 86_400,
    waitMs: options.waitMs ?? 5_000,
    leaseSeconds: options.leaseSeconds ?? 60,
    leaseMarginMs: options.leaseMarginMs ?? 2_000,
    replayCacheEntries: options.replayCacheEntries ?? 10_000,
    replayedHeaders: (options.replayedHeaders ?? DEFAULT_REPLAYED_HEADERS).map((h) => h.toLowerCase()).filter((h) => h !== 'set-cookie'),
    metrics: options.metrics ?? false,
    reaper: options.reaper ?? true,
    preparedStatements: options.preparedStatements ?? true,
    problemType: options.problemType ?? defaultProblemType,
    renderError: options.renderError ?? problemOf,
    responseEncryption: resolveResponseEncryption(options.responseEncryption),
  };
}

export const {
  ConfigurableModuleClass: ConfigurableIdempotencyModule,
  MODULE_OPTIONS_TOKEN: IDEMPOTENCY_MODULE_OPTIONS,
  ASYNC_OPTIONS_TYPE,
} = new ConfigurableModuleBuilder<IdempotencyModuleOptions>()
  .setClassMethodName('forRoot')
  // Global by default, as TypeOrmModule.forRoot is: every module with an @Idempotent() route needs the layer's providers, and there is one
  // layer per app.
  .setExtras({ isGlobal: true }, (definition, extras) => ({ ...definition, global: extras.isGlobal }))
  .build();

/** `IdempotencyModule.forRootAsync`'s argument: `useFactory` (with `inject`), `useClass` or `useExisting`, and `isGlobal`. */
export type IdempotencyModuleAsyncOptions = typeof ASYNC_OPTIONS_TYPE;

/** The resolved options, as every service of the layer injects them. */
export const IDEMPOTENCY_OPTIONS = Symbol('IDEMPOTENCY_OPTIONS');
