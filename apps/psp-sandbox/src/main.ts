/**
 * `npm run psp`: the sandbox provider alone, as its own process — a stand-in for a remote provider.
 * Point the service at it with PSP_BASE_URL=http://localhost:4000/psp.
 *   PSP_PORT (4000) · DATABASE_URL (unset → an embedded PostgreSQL of its own) · PSP_TIMEOUT_MS (2000)
 *   PSP_WEBHOOK_URL (the service's /webhooks/psp, e.g. http://localhost:3000/webhooks/psp; unset or none: no delivery)
 *   PSP_WEBHOOK_SECRET (the service's) · PSP_WEBHOOK_DUPLICATES (false)
 */
import 'reflect-metadata';
import { Module } from '@nestjs/common';
import { APP_FILTER, NestFactory } from '@nestjs/core';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { DataSource } from 'typeorm';
import { ProblemFilter } from '../../../src/common/problem.filter.js';
import { StartupError } from '../../../src/common/startup-error.js';
import { ConfigError, loadConfig } from '../../../src/config/app-config.js';
import { applyMigrations } from '../../../src/database/apply-migrations.js';
import { openDatabaseServer } from '../../../src/database/database-server.js';
import { typeormOptions } from '../../../src/database/typeorm-options.js';
import { stopOnSignals, takeOverSignals } from '../../../src/graceful-stop.js';
import { applyHttpRules, httpServerOptions } from '../../../src/http-app.js';
import { PspSandboxModule } from './psp-sandbox.module.js';

const DEFAULT_PORT = 4000;
// Not the service's embedded server (.data/postgres on 54329): both may run at once, each on a folder of its own
// (a second start on a folder in use is refused).
const DEFAULT_EMBEDDED_DIR = '.data/psp-postgres';
const DEFAULT_EMBEDDED_PORT = '54339';

function pspPort(raw: string | undefined): number {
  if (raw === undefined || raw === '') return DEFAULT_PORT;
  if (!/^\d+$/.test(raw.trim()) || Number(raw) > 65535) throw new ConfigError('PSP_PORT', 'must be a whole number from 0 to 65535', raw);
  return Number(raw);
}

/** The service's parsing and error words for what both read (DATABASE_URL, PSP_TIMEOUT_MS, EMBEDDED_PG_*, LOG_LEVEL). */
function sandboxConfig() {
  return loadConfig({
    ...process.env,
    EMBEDDED_PG_DIR: process.env.EMBEDDED_PG_DIR || DEFAULT_EMBEDDED_DIR,
    EMBEDDED_PG_PORT: process.env.EMBEDDED_PG_PORT || DEFAULT_EMBEDDED_PORT,
    // The sandbox authenticates nobody; loadConfig insists on API_KEYS with DATABASE_URL to protect the service, which is not running here.
    API_KEYS: process.env.API_KEYS || 'psp-sandbox:the-sandbox-takes-no-api-key',
    // This process IS the sandbox: what the service requires of a deployment (a named provider) does not apply.
    PSP_BASE_URL: '',
    PSP_SANDBOX: 'in-process',
  });
}

async function bootstrap(): Promise<void> {
  const config = sandboxConfig();
  const port = pspPort(process.env.PSP_PORT);
  const database = await openDatabaseServer(config);
  takeOverSignals();

  // The same migrations as the service, the same way (under the advisory lock every instance takes).
  const dataSource = new DataSource(typeormOptions(database.url, { lockTimeoutMs: 60_000, poolSize: 1 }));
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
  const delivery = config.pspWebhookDelivery.to === 'self' ? ({ to: 'none' } as const) : config.pspWebhookDelivery;
  @Module({
    imports: [
      PspSandboxModule.forRoot({
        databaseUrl: database.url,
        timeoutMs: config.pspTimeoutMs,
        webhooks: { delivery, duplicates: config.pspWebhookDuplicates, secret: config.pspWebhookSecret },
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
  await app.listen(port, '0.0.0.0');
  const { port: bound } = app.getHttpServer().address() as { port: number };
  console.log(
    [
      `psp-sandbox (dev/test only) listening on http://localhost:${bound}/psp`,
      `  database: ${database.embedded ? `embedded PostgreSQL in ${config.embeddedPgDir}` : 'DATABASE_URL'}` + (applied.length ? `, applied ${applied.join(', ')}` : ', schema up to date'),
      `  point the service at it: PSP_BASE_URL=http://localhost:${bound}/psp`,
      delivery.to === 'url'
        ? `  webhooks to ${delivery.url}${config.pspWebhookDuplicates ? ' (every event twice)' : ''}`
        : '  webhooks: not delivered (set PSP_WEBHOOK_URL to the service\'s /webhooks/psp and PSP_WEBHOOK_SECRET to its secret); queued in psp.webhook_outbox',
    ].join('\n'),
  );

  stopOnSignals(app, database);
}

bootstrap().catch((err: unknown) => {
  console.error(err instanceof ConfigError || err instanceof StartupError ? err.message : err);
  process.exit(1);
});
