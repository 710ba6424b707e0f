import 'reflect-metadata';
import { DataSource } from 'typeorm';
import { applyMigrations } from './database/apply-migrations.js';
import { ConfigError, DEV_API_CLIENT, loadConfig } from './config/app-config.js';
import { loadEnvFile } from './config/load-env-file.js';
import { openDatabaseServer } from './database/database-server.js';
import { stopOnSignals, takeOverSignals } from './graceful-stop.js';
import { createHttpApp } from './http-app.js';

async function bootstrap(): Promise<void> {
  loadEnvFile();
  const config = loadConfig();
  const database = await openDatabaseServer(config);
  takeOverSignals();

  const app = await createHttpApp({ config, databaseUrl: database.url });
  const applied = await applyMigrations(app.get(DataSource), config.databaseMigrationUrl);
  await app.listen(config.port, '0.0.0.0');
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
  if (config.pspSandboxOptedIn) {
    console.warn(`WARNING: PSP_SANDBOX=in-process on DATABASE_URL: the test sandbox at ${url}/psp takes test tokens as payments from anyone who reaches this port. Demos only; set PSP_BASE_URL for a real provider.`);
  }

  stopOnSignals(app, database);
}

bootstrap().catch((err: unknown) => {
  console.error(err instanceof ConfigError ? err.message : err);
  process.exit(1);
});
