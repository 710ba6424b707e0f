import type { Logger } from '@nestjs/common';
import pg from 'pg';
import { poolerSuspicion } from '../database/pooler-check.js';

/**
 * The listener's application_name: the outbox's trigger NOTIFYs only while a connection of this name is on the
 * database (migration 1764415500000), so creates skip NOTIFY's server-wide commit lock when no relay listens.
 */
export const RELAY_LISTENER_NAME = 'order-events-relay';

/** A LISTEN connection that dropped is opened again after this long (the relay polls fast meanwhile). */
const RELISTEN_DELAY_MS = 1_000;

export interface OutboxListener {
  /** False behind a transaction pooler: LISTEN is not attempted and the caller keeps polling. */
  available: boolean;
  stop(): Promise<void>;
}

/**
 * LISTENs on `channel` on a connection of its own (outside the pool: held as long as the relay runs) and opens it
 * again whenever it drops, saying so through `listening`. Behind a transaction pooler (the server's port is not the
 * URL's, see pooler-check.ts) LISTEN would land on whichever server connection the pooler lends next: not attempted.
 * The same logic as the sandbox's SandboxDatabase.listen, which keeps its own copy (see the transactional-outbox page).
 */
export async function listenForOutbox(
  databaseUrl: string,
  channel: string,
  logger: Logger,
  on: { notified(): void; listening(up: boolean): void },
): Promise<OutboxListener> {
  let client: pg.Client | undefined;
  let retry: NodeJS.Timeout | undefined;
  let stopped = false;
  const again = () => {
    if (!stopped) retry = setTimeout(() => void connect(), RELISTEN_DELAY_MS);
  };
  const connect = async (): Promise<boolean> => {
    const next = new pg.Client({ connectionString: databaseUrl, application_name: RELAY_LISTENER_NAME });
    // A drop (database restart) emits 'error' and then 'end': heard once, by 'end'.
    next.on('error', (err) => logger.warn(`order events listener connection failed: ${err.message}`));
    next.on('notification', () => on.notified());
    try {
      await next.connect();
      const [{ port }] = (await next.query<{ port: number | null }>('SELECT inet_server_port() AS port')).rows;
      if (poolerSuspicion(databaseUrl, port)) {
        await next.end();
        return false;
      }
      await next.query(`LISTEN ${pg.escapeIdentifier(channel)}`);
    } catch (err) {
      logger.warn(`order events listener could not start (${(err as Error).message}); polling until it can`);
      await next.end().catch(() => undefined);
      again();
      return true;
    }
    if (stopped) {
      await next.end();
      return true;
    }
    client = next;
    next.once('end', () => {
      client = undefined;
      on.listening(false);
      again();
    });
    on.listening(true);
    return true;
  };
  const available = await connect();
  return {
    available,
    stop: async () => {
      stopped = true;
      clearTimeout(retry);
      const open = client;
      client = undefined;
      await open?.end().catch(() => undefined);
    },
  };
}
