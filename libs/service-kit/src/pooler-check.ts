import { ConfigError } from './config-error.js';

/** PostgreSQL's port when a URL names none. */
const DEFAULT_PORT = 5432;

/**
 * A connection pooler (PgBouncer, RDS Proxy, Supavisor) answers on a port of its own while the
 * server behind it reports the port it listens on (`inet_server_port()`): when the two differ,
 * something sits between the service and PostgreSQL. What the pooler cannot carry — named
 * statements (`DATABASE_PREPARED_STATEMENTS`), the migrations' session lock (`DATABASE_MIGRATION_URL`)
 * — then needs a choice made, which start-up asks for, naming the variable. (A port mapping —
 * Docker's, a tunnel — differs too: there the answer is true, or the same URL.) Over a Unix socket
 * the server reports no port, and nothing can be told.
 */
export function poolerSuspicion(
  databaseUrl: string,
  serverPort: number | null,
  variable: 'DATABASE_PREPARED_STATEMENTS' | 'DATABASE_MIGRATION_URL' = 'DATABASE_PREPARED_STATEMENTS',
): ConfigError | undefined {
  if (serverPort === null) return undefined;
  const urlPort = Number(new URL(databaseUrl).port || DEFAULT_PORT);
  if (urlPort === serverPort) return undefined;
  const why = `DATABASE_URL's port ${urlPort} is not the port PostgreSQL listens on (${serverPort}), so a connection pooler may be in between`;
  const choice =
    variable === 'DATABASE_PREPARED_STATEMENTS'
      ? 'Set false for a transaction pooler that cannot keep named statements (PgBouncer before 1.21), true for one that can or for a plain port mapping'
      : "Set it to a direct connection to PostgreSQL: the migrations' session advisory lock cannot be held through a transaction pooler (for a plain port mapping, the same URL as DATABASE_URL)";
  return new ConfigError(variable, `must be set: ${why}. ${choice}`, '');
}
