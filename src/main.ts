import 'reflect-metadata';
import type { NestFastifyApplication } from '@nestjs/platform-fastify';
import { createServer } from 'node:net';
import { DataSource } from 'typeorm';
import { DEV_API_CLIENT, loadConfig, printableUrl } from './config/app-config.js';
import { PROVIDER_KEY_SCHEME } from '#psp-sandbox';
import { ORDER_EVENTS_EXCHANGE } from './events/order-events-outbox.js';
import { loadEnvFile } from './config/load-env-file.js';
import { createHttpApp } from './http-app.js';
import { CommitDurabilityCheck } from './database/database.module.js';
import {
  applyMigrations,
  boundTo,
  browsableHost,
  ConfigError,
  databaseAddress,
  openDatabaseServer,
  StartupError,
  stopOnSignals,
  takeOverSignals,
} from '#service-kit';

const portInUse = (port: number, cause: unknown) =>
  new StartupError(`PORT ${port} is in use by another program (another npm start?): set PORT to a free port`, { cause });

/** Before the database is started and migrated: a port someone else holds is refused at once. */
async function checkPortFree(port: number, host: string): Promise<void> {
  if (port === 0) return;
  const probe = createServer();
  await new Promise<void>((listening, failed) => {
    probe.once('error', failed);
    probe.listen(port, host, listening);
  }).catch((err: unknown) => {
    throw (err as NodeJS.ErrnoException).code === 'EADDRINUSE' ? portInUse(port, err) : err;
  });
  await new Promise((closed) => probe.close(closed));
}

/** listen(), with a port taken since checkPortFree said in the same line. */
async function listen(app: NestFastifyApplication, port: number, host: string): Promise<number> {
  try {
    await app.listen(port, host);
  } catch (err) {
    throw (err as NodeJS.ErrnoException).code === 'EADDRINUSE' ? portInUse(port, err) : err;
  }
  // The bound port, which differs from PORT when PORT=0 (tests ask for any free port).
  return (app.getHttpServer().address() as { port: number }).port;
}

async function bootstrap(): Promise<void> {
  loadEnvFile();
  const config = loadConfig();
  await checkPortFree(config.port, config.host);
  // Said before the wait, so that a wrong address is seen at once.
  if (config.databaseUrl) console.log(`connecting to DATABASE_URL (${databaseAddress(config.databaseUrl)})`);
  const database = await openDatabaseServer(config);
  takeOverSignals(database);

  let app: NestFastifyApplication | undefined;
  let applied: string[];
  let port: number;
  try {
    app = await createHttpApp({ config, databaseUrl: database.url });
    applied = await applyMigrations(app.get(DataSource), config.databaseMigrationUrl);
    port = await listen(app, config.port, config.host);
  } catch (err) {
    await app?.close().catch(() => undefined);
    await database.stop();
    throw err;
  }
  const commits = await app.get(CommitDurabilityCheck).current();
  // Last, so that it is what the first screen shows.
  const url = `http://${browsableHost(config.host)}:${port}`;
  const lines = [
    `idempotent-orders listening on ${url} (${boundTo(config.host)})`,
    `  database: ${database.embedded ? `embedded PostgreSQL in ${config.embeddedPgDir} (port ${config.embeddedPgPort})` : `DATABASE_URL (${databaseAddress(database.url)})`}` +
      (applied.length ? `, applied ${applied.join(', ')}` : ', schema up to date'),
    `  commits: ${commits === 'synchronous-standby' ? 'acknowledged once a synchronous standby has them' : 'acknowledged by the primary alone (no synchronous standby)'}`,
    `  Swagger UI: ${url}/docs (OpenAPI at ${url}/docs-json)`,
    config.amqpUrls
      ? `  order events: published to AMQP_URL (${config.amqpUrls.map(printableUrl).join(',')}), exchange ${ORDER_EVENTS_EXCHANGE}`
      : '  order events: relay off (AMQP_URL unset): events wait in the order_events_outbox table',
  ];
  if (config.usingDevApiKey) lines.push(`  dev API key for "Authorize": ${DEV_API_CLIENT.secret}  (client "${DEV_API_CLIENT.clientId}")`);
  // The published dev key only (a key of one's own is a secret): what a Swagger UI user needs to try /psp.
  if (config.pspSandbox === 'in-process' && config.usingDevPspApiKey)
    lines.push(`  dev provider key for /psp (Swagger UI "Authorize", ${PROVIDER_KEY_SCHEME}): ${config.pspApiKey}`);
  console.log(lines.join('\n'));
  if (config.production && commits === 'primary-only') {
    console.warn(
      'WARNING: the primary acknowledges commits alone: a failover can lose the last acknowledged writes (orders, payments). ' +
        'Give it a synchronous standby (Patroni: synchronous_mode: true), or set DATABASE_REQUIRE_SYNCHRONOUS_STANDBY=true to refuse to start without one.',
    );
  }
  if (config.pspSandboxOptedIn) {
    console.warn(
      `WARNING: PSP_SANDBOX=in-process on DATABASE_URL: the test sandbox at ${url}/psp takes test tokens as payments from anyone who reaches this port. Demos only; set PSP_BASE_URL for a real provider.`,
    );
  }

  stopOnSignals(app, database);
}

bootstrap().catch((err: unknown) => {
  // An expected refusal is its message alone; anything else is a bug, with its stack.
  console.error(err instanceof ConfigError || err instanceof StartupError ? err.message : err);
  process.exit(1);
});
