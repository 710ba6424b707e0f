/**
 * `npm run psp`: the sandbox provider alone, as its own process — a stand-in for a remote provider.
 * Point the service at it with PSP_BASE_URL=http://localhost:4000/psp and the same PSP_API_KEY.
 *   PSP_PORT (4000) · DATABASE_URL (unset → an embedded PostgreSQL of its own) · PSP_TIMEOUT_MS (2000)
 *   PSP_API_KEY (the key every request must carry; unset → the published dev key, refused with DATABASE_URL)
 *   PSP_WEBHOOK_URL (the service's /webhooks/psp, e.g. http://localhost:3000/webhooks/psp; unset or none: no delivery)
 *   PSP_WEBHOOK_SECRET (the service's) · PSP_WEBHOOK_DUPLICATES (false)
 */
import 'reflect-metadata';
import { Module } from '@nestjs/common';
import { APP_FILTER, NestFactory } from '@nestjs/core';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { DataSource } from 'typeorm';
import {
  applyHttpRules,
  applyMigrations,
  ConfigError,
  httpServerOptions,
  migrationDataSourceOptions,
  openDatabaseServer,
  ProblemFilter,
  StartupError,
  stopOnSignals,
  takeOverSignals,
} from '#service-kit';
import { pspSandboxMigrations } from '../migrations/index.js';
import { loadSandboxConfig } from './sandbox-config.js';
import { PspSandboxModule } from './psp-sandbox.module.js';

async function bootstrap(): Promise<void> {
  const config = loadSandboxConfig();
  const database = await openDatabaseServer(config);
  takeOverSignals();

  // Its own migrations, the way the service applies its own (under the advisory lock every app of this repository takes):
  // on a database the service migrated before the sandbox had a list of its own, they are recorded as applied already.
  const dataSource = new DataSource(migrationDataSourceOptions(database.url, pspSandboxMigrations, 'psp-sandbox'));
  await dataSource.initialize();
  let applied: string[];
  try {
    applied = await applyMigrations(dataSource);
  } finally {
    await dataSource.destroy();
  }

  // Alone, there is no "self" to deliver to: this process has no /webhooks/psp, and guessing the
  // service's address (localhost:3000?) would retry into the void or into a stranger. Unset means
  // no delivery, said out loud; events still queue in the outbox, so setting PSP_WEBHOOK_URL and
  // restarting delivers them all.
  const delivery = config.webhookDelivery;
  @Module({
    imports: [
      PspSandboxModule.forRoot({
        databaseUrl: database.url,
        apiKey: config.apiKey,
        timeoutMs: config.timeoutMs,
        webhooks: { delivery, duplicates: config.webhookDuplicates, secret: config.webhookSecret },
      }),
    ],
    providers: [{ provide: APP_FILTER, useClass: ProblemFilter }],
  })
  class PspStandaloneModule {}

  const app = await NestFactory.create<NestFastifyApplication>(PspStandaloneModule, new FastifyAdapter(httpServerOptions()), {
    bodyParser: false,
    logger: ['error', 'warn'],
  });
  applyHttpRules(app);
  await app.listen(config.port, '0.0.0.0');
  const { port: bound } = app.getHttpServer().address() as { port: number };
  console.log(
    [
      `psp-sandbox (dev/test only) listening on http://localhost:${bound}/psp`,
      `  database: ${database.embedded ? `embedded PostgreSQL in ${config.embeddedPgDir}` : 'DATABASE_URL'}` +
        (applied.length ? `, applied ${applied.join(', ')}` : ', schema up to date'),
      `  point the service at it: PSP_BASE_URL=http://localhost:${bound}/psp, with the same PSP_API_KEY`,
      ...(config.usingDevApiKey
        ? [
            `  dev provider key for /psp: ${config.apiKey} (PSP_API_KEY unset; a service with PSP_BASE_URL refuses it: set a key of your own on both)`,
          ]
        : []),
      delivery.to === 'url'
        ? `  webhooks to ${delivery.url}${config.webhookDuplicates ? ' (every event twice)' : ''}`
        : "  webhooks: not delivered (set PSP_WEBHOOK_URL to the service's /webhooks/psp and PSP_WEBHOOK_SECRET to its secret); queued in psp.webhook_outbox",
    ].join('\n'),
  );

  stopOnSignals(app, database);
}

bootstrap().catch((err: unknown) => {
  console.error(err instanceof ConfigError || err instanceof StartupError ? err.message : err);
  process.exit(1);
});
