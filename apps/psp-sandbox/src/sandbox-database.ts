import { Inject, Injectable, Logger, type OnApplicationShutdown } from '@nestjs/common';
import pg from 'pg';
import { listenForNotifications } from '#outbox-relay';
import { SANDBOX_OPTIONS, type SandboxOptions } from './sandbox-options.js';
import { poolerSuspicion, ProblemException } from '#service-kit';

/**
 * A few connections are plenty for a stand-in; being its own pool means the provider can never
 * take a connection the service's requests are waiting for, and its writes never join the
 * service's transactions (the service's Database carries those with AsyncLocalStorage).
 */
const POOL_SIZE = 5;
/** A provider that cannot get a connection this fast answers 503, as an overloaded one would. */
const CONNECT_WAIT_MS = 5_000;

export type SandboxClient = Pick<pg.PoolClient, 'query'>;

/** What listen() reports: each notification, and whether the listener is up (false until it is, and after a drop). */
export interface ListenHandlers {
  notified(): void;
  listening(up: boolean): void;
}

/** The sandbox's own `pg` pool on the service's database: raw SQL in the `psp` schema. */
@Injectable()
export class SandboxDatabase implements OnApplicationShutdown {
  private readonly logger = new Logger('PspSandbox');
  private readonly pool: pg.Pool;

  private readonly databaseUrl: string;

  constructor(@Inject(SANDBOX_OPTIONS) options: SandboxOptions) {
    this.databaseUrl = options.databaseUrl;
    this.pool = new pg.Pool({
      connectionString: options.databaseUrl,
      max: POOL_SIZE,
      connectionTimeoutMillis: CONNECT_WAIT_MS,
      // A duplicate waits on the first request's key row for at most lock_timeout (then 409, which clients retry).
      options: '-c lock_timeout=10000 -c statement_timeout=30000 -c idle_in_transaction_session_timeout=60000',
      application_name: 'psp-sandbox',
    });
    // An idle connection that breaks (a database restart) emits here; unheard, it would crash the process.
    this.pool.on('error', (err) => this.logger.warn(`idle sandbox connection failed: ${err.message}`));
  }

  async query<T>(sql: string, params: unknown[] = []): Promise<T[]> {
    const client = await this.connect();
    try {
      return (await client.query(sql, params)).rows as T[];
    } finally {
      client.release();
    }
  }

  /** Runs `fn` in one transaction on one connection; commits when it resolves, rolls back when it throws. */
  async transaction<T>(fn: (client: SandboxClient) => Promise<T>): Promise<T> {
    const client = await this.connect();
    let reusable = true;
    try {
      await client.query('BEGIN');
      const result = await fn(client);
      await client.query('COMMIT');
      return result;
    } catch (err) {
      await client.query('ROLLBACK').catch(() => (reusable = false));
      throw err;
    } finally {
      client.release(!reusable);
    }
  }

  /** Connections that already have an error listener (pg reuses them). */
  private readonly guarded = new WeakSet<pg.PoolClient>();

  /**
   * A pooled connection with an error listener: pg-pool listens only on IDLE connections, so one
   * checked out between two statements when the server dies would otherwise crash the process.
   */
  private async connect(): Promise<pg.PoolClient> {
    try {
      const client = await this.pool.connect();
      if (!this.guarded.has(client)) {
        client.on('error', (err) => this.logger.warn(`sandbox connection failed while in use: ${err.message}`));
        this.guarded.add(client);
      }
      return client;
    } catch (err) {
      // pg-pool's words for connectionTimeoutMillis; anything else is a real connection failure (500).
      if (err instanceof Error && err.message === 'timeout exceeded when trying to connect') {
        throw ProblemException.of(503, 'psp-overloaded', 'Provider overloaded', 'The sandbox provider is busy; retry shortly.');
      }
      throw err;
    }
  }

  /**
   * LISTENs on `channel` on a connection of its own (outside the pool: it is held for as long as the process
   * runs), and opens it again whenever it drops. Behind a transaction pooler (the server's port is not the
   * URL's, see pooler-check.ts) LISTEN would land on whichever server connection the pooler lends next, so
   * it is not attempted: `available` false, and the caller keeps polling. Otherwise true; a first connection
   * that fails is retried like a drop, and `listening` says when it is up. stop() closes it for good.
   */
  async listen(channel: string, on: ListenHandlers): Promise<{ available: boolean; stop(): Promise<void> }> {
    return listenForNotifications({
      databaseUrl: this.databaseUrl,
      channel,
      applicationName: 'psp-sandbox-listener',
      pooled: (port) => poolerSuspicion(this.databaseUrl, port) !== undefined,
      warn: (message) => this.logger.warn(message),
      notified: () => on.notified(),
      listening: (up) => on.listening(up),
    });
  }

  /** After the HTTP server has stopped, so requests in flight finish their transactions first. */
  async onApplicationShutdown(): Promise<void> {
    await this.pool.end();
  }
}
