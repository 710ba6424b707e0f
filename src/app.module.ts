import { type DynamicModule, Module } from '@nestjs/common';
import { APP_FILTER, APP_GUARD, DiscoveryModule, HttpAdapterHost } from '@nestjs/core';
import { ScheduleModule } from '@nestjs/schedule';
import { TypeOrmModule } from '@nestjs/typeorm';
import { IdempotencyModule } from '@idempotent-orders/idempotency';
import { LoggerModule } from 'nestjs-pino';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { ApiKeyGuard } from './common/api-key.guard.js';
import { ApiKeys } from './common/api-keys.js';
import { type AppConfig, LEASE_MARGIN_MS } from './config/app-config.js';
import { APP_CONFIG, ConfigModule } from './config/config.module.js';
import { DatabaseModule } from './database/database.module.js';
import { typeormOptions } from './database/typeorm-options.js';
import { OrderEventsModule } from './events/order-events.module.js';
import { HealthModule } from './health/health.module.js';
import { MetricsModule } from './metrics/metrics.module.js';
import { Registry } from 'prom-client';
import { OrdersModule } from './orders/orders.module.js';
import { PaymentsModule } from './payments/payments.module.js';
import { PspClientModule } from './psp-client/psp-client.module.js';
import { PspSandboxModule, selfUrl } from '#psp-sandbox';
import { SubmitTokensModule } from './submit-tokens/submit-tokens.module.js';
import { WebhooksModule } from './webhooks/webhooks.module.js';
import { ProblemFilter, problemType, requestIdOf, toProblem } from '#service-kit';

/**
 * Whether every request gets its line (pino-http): at debug and trace only. At the default info a successful request
 * writes nothing, and a refused or failed one gets one line from the problem filter (sendProblem).
 */
const logsRequests = (level: AppConfig['logLevel']) => level === 'debug' || level === 'trace';

export interface AppOptions {
  config: AppConfig;
  /** The database to use: DATABASE_URL, or the embedded server main.ts started. */
  databaseUrl: string;
}

@Module({})
export class AppModule {
  static forRoot({ config, databaseUrl }: AppOptions): DynamicModule {
    return {
      module: AppModule,
      imports: [
        // authenticateBeforeBody reads which routes the ApiKeyGuard guards from the controllers.
        DiscoveryModule,
        ConfigModule.forRoot(config),
        LoggerModule.forRoot({
          // pino-http builds a child logger and runs the rest of every request in an async context of its own
          // (measured: 16 % of a create's CPU), so it is installed only where a line per request is asked for
          // (debug, trace). Refusals and failures name their request id themselves (sendProblem), and every
          // response carries X-Request-Id (http-app.ts).
          ...(logsRequests(config.logLevel) ? {} : { forRoutes: [] }),
          pinoHttp: {
            level: config.logLevel,
            genReqId: requestIdOf,
            // Health probes and scrapes would drown the log.
            autoLogging: { ignore: (req) => req.url === '/health' || req.url === '/metrics' },
            // pino-http serialises the request into a child logger on EVERY request, logged or not:
            // keep it to what a log line needs. No headers, so no credentials to redact.
            serializers: {
              req: (req: { id: string; method: string; url: string }) => ({ id: req.id, method: req.method, url: req.url }),
              res: (res: { statusCode: number }) => ({ statusCode: res.statusCode }),
            },
          },
        }),
        // No session settings: they ride with each transaction (Database), which a transaction pooler keeps.
        TypeOrmModule.forRoot(
          typeormOptions(
            databaseUrl,
            { poolSize: config.databasePoolSize, poolWaitMs: config.databasePoolWaitMs },
            // Its migrations then run with the service's (main.ts applies this DataSource's list).
            config.pspSandbox,
          ),
        ),
        // The Idempotency-Key layer: its transactions (Database), the claim and replay, the atomic phases.
        IdempotencyModule.forRootAsync({
          inject: [APP_CONFIG, Registry],
          useFactory: (appConfig: AppConfig, registry: Registry) => ({
            // ApiKeyGuard runs first and names the caller.
            callerScope: (req) => (req as { clientId?: string }).clientId,
            ttlSeconds: appConfig.idempotencyTtlSeconds,
            waitMs: appConfig.idempotencyWaitMs,
            leaseSeconds: appConfig.idempotencyLeaseSeconds,
            leaseMarginMs: LEASE_MARGIN_MS,
            replayCacheEntries: appConfig.idempotencyReplayCacheEntries,
            preparedStatements: appConfig.databasePreparedStatements ?? true,
            metrics: registry,
            problemType,
            renderError: toProblem,
            responseEncryption: appConfig.idempotencyEncryption ?? false,
          }),
        }),
        DatabaseModule,
        ScheduleModule.forRoot(),
        MetricsModule,
        // The order events' relay to RabbitMQ (AMQP_URL; off without it) and its metrics.
        OrderEventsModule,
        HealthModule,
        OrdersModule,
        SubmitTokensModule,
        // The sandbox provider, in-process: on the embedded database, or on a real one when PSP_SANDBOX asks for it.
        // src/ imports the sandbox app through its entry, one way (the app imports nothing of src/; lint), so that
        // `npm start` stays one command.
        ...(config.pspSandbox === 'off'
          ? []
          : [
              PspSandboxModule.forRoot({
                databaseUrl,
                // The key the client below sends: one value, held in this process's memory by both sides.
                apiKey: config.pspApiKey,
                timeoutMs: config.pspTimeoutMs,
                webhooks: { delivery: config.pspWebhookDelivery, duplicates: config.pspWebhookDuplicates, secret: config.pspWebhookSecret },
              }),
            ]),
        PspClientModule.forRootAsync({
          inject: [HttpAdapterHost],
          useFactory: (host: HttpAdapterHost) => ({
            // The in-process sandbox is called over real HTTP on this app's own port (known once it listens).
            baseUrl: () => config.pspBaseUrl ?? `${selfUrl((host.httpAdapter.getHttpServer() as Server).address() as AddressInfo)}/psp`,
            apiKey: config.pspApiKey,
            timeoutMs: config.pspTimeoutMs,
            maxAttempts: config.pspMaxAttempts,
            breakerThreshold: config.pspBreakerThreshold,
            breakerHalfOpenMs: config.pspBreakerHalfOpenMs,
          }),
        }),
        PaymentsModule,
        WebhooksModule,
      ],
      providers: [ApiKeys, { provide: APP_GUARD, useClass: ApiKeyGuard }, { provide: APP_FILTER, useClass: ProblemFilter }],
    };
  }
}
