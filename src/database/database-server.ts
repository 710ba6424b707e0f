import { Client } from 'pg';
import { StartupError } from '../common/startup-error.js';
import type { DatabaseConfig } from '../config/app-config.js';
import { type DataFolderOwner, runningEmbeddedServer, startEmbeddedPostgres } from './embedded-postgres.js';

export interface DatabaseServer {
  url: string;
  embedded: boolean;
  /** Set when this process uses the embedded server another live process runs (and will stop). */
  sharedWith?: DataFolderOwner;
  stop(): Promise<void>;
}

// Long enough for a server across the world, short enough that a wrong host is said within seconds.
const CONNECT_TIMEOUT_MS = 10_000;

/** `user@host:port/database` of a PostgreSQL URL: where it connects, never its password. */
export function databaseAddress(url: string): string {
  try {
    const parsed = new URL(url);
    const user = parsed.username ? `${decodeURIComponent(parsed.username)}@` : '';
    return `${user}${parsed.hostname || 'localhost'}:${parsed.port || 5432}/${decodeURIComponent(parsed.pathname.slice(1)) || '(default database)'}`;
  } catch {
    return '(an unparsable URL)';
  }
}

/**
 * One connection before anything else, so that a wrong DATABASE_URL is one line naming it, at once, rather than
 * TypeORM's ten "Unable to connect… Retrying" over thirty seconds and a stack trace.
 */
async function checkConnects(url: string): Promise<void> {
  const client = new Client({ connectionString: url, connectionTimeoutMillis: CONNECT_TIMEOUT_MS });
  client.on('error', () => undefined);
  try {
    await client.connect();
    await client.query('SELECT 1');
  } catch (err) {
    throw new StartupError(`Cannot connect to the database of DATABASE_URL (${databaseAddress(url)}): ${(err as Error).message}`, { cause: err });
  } finally {
    await client.end().catch(() => undefined);
  }
}

export interface OpenOptions {
  /**
   * Use the embedded server another live process (a running `npm start`) holds in EMBEDDED_PG_DIR instead of
   * refusing: for the migration commands, which are short and are built to run next to serving processes.
   */
  shareRunning?: boolean;
}

/** DATABASE_URL when set; otherwise the embedded PostgreSQL in EMBEDDED_PG_DIR (kept across runs). */
export async function openDatabaseServer(config: DatabaseConfig, { shareRunning = false }: OpenOptions = {}): Promise<DatabaseServer> {
  if (config.databaseUrl) {
    await checkConnects(config.databaseUrl);
    return { url: config.databaseUrl, embedded: false, stop: () => Promise.resolve() };
  }
  const running = shareRunning ? await runningEmbeddedServer(config.embeddedPgDir) : undefined;
  // Its owner stops it; this process only connects.
  if (running) return { url: running.url, embedded: true, sharedWith: running.owner, stop: () => Promise.resolve() };
  // In a session of its own: Ctrl-C reaches this process alone, which stops the server after draining.
  const server = await startEmbeddedPostgres({ dir: config.embeddedPgDir, port: config.embeddedPgPort, ownSession: true });
  return { url: server.url, embedded: true, stop: () => server.stop() };
}
