import type { DatabaseConfig } from '../config/app-config.js';
import { startEmbeddedPostgres } from './embedded-postgres.js';

export interface DatabaseServer {
  url: string;
  embedded: boolean;
  stop(): Promise<void>;
}

/** DATABASE_URL when set; otherwise the embedded PostgreSQL in EMBEDDED_PG_DIR (kept across runs). */
export async function openDatabaseServer(config: DatabaseConfig): Promise<DatabaseServer> {
  if (config.databaseUrl) {
    return { url: config.databaseUrl, embedded: false, stop: () => Promise.resolve() };
  }
  const server = await startEmbeddedPostgres({ dir: config.embeddedPgDir, port: config.embeddedPgPort });
  return { url: server.url, embedded: true, stop: () => server.stop() };
}
