import type { EmbeddedServer } from '../../src/database/embedded-postgres';

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
}
