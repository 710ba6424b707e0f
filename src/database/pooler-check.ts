import { ConfigError } from '../config/app-config.js';

/** PostgreSQL's port when a URL names none. */
const DEFAULT_PORT = 5432;

/**
 * A connection pooler (PgBouncer, RDS Proxy, Supavisor) answers on a port of its own while the
 * server behind it reports the port it listens on (`inet_server_port()`): when the two differ,
 * something sits between the service and PostgreSQL. Named statements survive only a pooler that
 * keeps them, so with DATABASE_PREPARED_STATEMENTS unset that is a choice start-up asks for.
 * (A port mapping — Docker's, a tunnel — differs too; there, true is the answer.) Over a Unix
 * socket the server reports no port, and nothing can be told.
 */
export function poolerSuspicion(databaseUrl: string, serverPort: number | null): ConfigError | undefined {
  if (serverPort === null) return undefined;
  const urlPort = Number(new URL(databaseUrl).port || DEFAULT_PORT);
  if (urlPort === serverPort) return undefined;
  return new ConfigError(
    'DATABASE_PREPARED_STATEMENTS',
    `must be set: DATABASE_URL's port ${urlPort} is not the port PostgreSQL listens on (${serverPort}), so a connection pooler may be in between. ` +
      'Set false for a transaction pooler that cannot keep named statements (PgBouncer before 1.21), true for one that can or for a plain port mapping',
    '',
  );
}
