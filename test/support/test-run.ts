import type { EmbeddedServer } from '#service-kit/embedded-postgres';
import type { PgBouncer } from './pgbouncer';

/** Databases of one run share its id, so a run on a shared DATABASE_URL server cleans up only its own. */
export const testDatabasePrefix = (runId: string) => `io_test_${runId}_`;

/** Every test database is cloned from this one, which has all migrations applied. */
export const templateDatabase = (runId: string) => `${testDatabasePrefix(runId)}template`;

export function databaseUrl(serverUrl: string, database: string): string {
  const url = new URL(serverUrl);
  url.pathname = `/${database}`;
  return url.toString();
}

export interface TestRun {
  id: string;
  adminUrl: string;
  server?: EmbeddedServer;
  dir?: string;
  /** TEST_PGBOUNCER=1: the pooler the services under test reach the database through. */
  pooler?: PgBouncer;
}

/**
 * With TEST_PGBOUNCER=1 (globalSetup then starts one and sets TEST_POOLER_PORT), what a service under
 * test is given instead of `directUrl`: the same database through PgBouncer in transaction mode, with
 * named statements off and the migrations on the direct URL, as a deployment behind it runs. The
 * tests' own checks keep the direct URL.
 */
export function throughPooler(directUrl: string, env: Record<string, string> = {}): Record<string, string> {
  const port = process.env.TEST_POOLER_PORT;
  // A test that chose DATABASE_PREPARED_STATEMENTS chose its connection too.
  if (!port || env.DATABASE_PREPARED_STATEMENTS !== undefined) return {};
  const url = new URL(directUrl);
  url.hostname = '127.0.0.1';
  url.port = port;
  return { DATABASE_URL: url.toString(), DATABASE_PREPARED_STATEMENTS: 'false', DATABASE_MIGRATION_URL: directUrl };
}
