import pg from 'pg';

/** A LISTEN connection that dropped is opened again after this long (the relay polls fast meanwhile). */
const RELISTEN_DELAY_MS = 1_000;

export interface NotificationListener {
  /** False when `pooled` said a transaction pooler is in between: LISTEN is not attempted, the caller keeps polling. */
  available: boolean;
  stop(): Promise<void>;
}

export interface ListenOptions {
  databaseUrl: string;
  channel: string;
  /** The connection's application_name (a trigger may look for it before it NOTIFYs). */
  applicationName: string;
  /**
   * Whether the server's port (inet_server_port()) says a transaction pooler is in between: LISTEN would then land on
   * whichever server connection the pooler lends next.
   */
  pooled(serverPort: number | null): boolean;
  warn(message: string): void;
  notified(): void;
  /** The connection is up (LISTENing) or down; false until it is up, and after a drop. */
  listening(up: boolean): void;
}

/**
 * LISTENs on a connection of its own (outside any pool: held as long as the relay runs) and opens it again whenever
 * it drops (a database restart); a first connection that fails is retried like a drop. stop() closes it for good.
 */
export async function listenForNotifications(options: ListenOptions): Promise<NotificationListener> {
  const { databaseUrl, channel, applicationName } = options;
  const warn = (message: string) => options.warn(message);
  let client: pg.Client | undefined;
  let retry: NodeJS.Timeout | undefined;
  let stopped = false;
  const again = () => {
    if (!stopped) retry = setTimeout(() => void connect(), RELISTEN_DELAY_MS);
  };
  const connect = async (): Promise<boolean> => {
    const next = new pg.Client({ connectionString: databaseUrl, application_name: applicationName });
    // A drop emits 'error' and then 'end': heard once, by 'end'.
    next.on('error', (err) => warn(`${applicationName} connection failed: ${err.message}`));
    next.on('notification', () => options.notified());
    try {
      await next.connect();
      const [{ port }] = (await next.query<{ port: number | null }>('SELECT inet_server_port() AS port')).rows;
      if (options.pooled(port)) {
        await next.end();
        return false;
      }
      await next.query(`LISTEN ${pg.escapeIdentifier(channel)}`);
    } catch (err) {
      warn(`${applicationName} could not start (${(err as Error).message}); polling until it can`);
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
      options.listening(false);
      again();
    });
    options.listening(true);
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
