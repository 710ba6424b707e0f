/**
 * A real PgBouncer (Debian's `pgbouncer` package) in TRANSACTION mode in front of the test
 * PostgreSQL: what replicas share a database through in production. On a free port, from a
 * temporary config, stopped and removed even when starting fails.
 *
 * Jest's globalSetup loads this file through require: node built-ins only, no relative '.js' imports.
 */
import { execFile } from 'node:child_process';
import { chown, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);
const START_DEADLINE_MS = 10_000;
const STOP_DEADLINE_MS = 10_000;

export interface PgBouncer {
  port: number;
  /** The same database, user and password as `directUrl`, through the pooler. */
  pooledUrl(directUrl: string): string;
  /** Stops the pooler (SIGTERM: every client connection is cut at once); `start` brings it back on the same port. */
  down(): Promise<void>;
  start(): Promise<void>;
  /** Stops it for good and removes its files. */
  stop(): Promise<void>;
}

const until = async (what: string, deadlineMs: number, done: () => Promise<boolean>) => {
  const deadline = Date.now() + deadlineMs;
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`pgbouncer: ${what} within ${deadlineMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
};

const accepts = (port: number) =>
  new Promise<boolean>((resolve) => {
    const socket = connect(port, '127.0.0.1');
    socket.once('connect', () => (socket.destroy(), resolve(true)));
    socket.once('error', () => resolve(false));
  });

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/**
 * `serverUrl`: the PostgreSQL to pool (its user and password are the ones PgBouncer logs in with).
 * Every database name is passed through (`*`), so each test file's own database works as is.
 */
export async function startPgBouncer(serverUrl: string, port: number): Promise<PgBouncer> {
  const server = new URL(serverUrl);
  const user = decodeURIComponent(server.username);
  const password = decodeURIComponent(server.password);
  const dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-pgbouncer-'));
  const config = join(dir, 'pgbouncer.ini');
  const pidFile = join(dir, 'pgbouncer.pid');
  // PgBouncer refuses to run as root: here it runs as the postgres user, which must own its files.
  const asRoot = process.getuid?.() === 0;
  let pid: number | undefined;

  const start = async () => {
    const command = `pgbouncer -d ${config}`;
    await (asRoot ? run('su', ['postgres', '-s', '/bin/sh', '-c', command]) : run('pgbouncer', ['-d', config]));
    await until('wrote its pid file', START_DEADLINE_MS, async () => {
      const text = await readFile(pidFile, 'utf8').catch(() => '');
      pid = Number(text.trim()) || undefined;
      return pid !== undefined;
    });
    await until(`accepts connections on ${port}`, START_DEADLINE_MS, () => accepts(port));
  };
  const stop = async () => {
    if (pid === undefined) return;
    const stopping = pid;
    pid = undefined;
    // SIGTERM: immediate shutdown, every client connection closed (what a crash or a restart does to clients).
    process.kill(stopping, 'SIGTERM');
    await until('stopped', STOP_DEADLINE_MS, () => Promise.resolve(!alive(stopping))).catch(() => process.kill(stopping, 'SIGKILL'));
    await rm(pidFile, { force: true });
  };

  try {
    await writeFile(join(dir, 'userlist.txt'), `"${user}" "${password}"\n`);
    await writeFile(
      config,
      [
        '[databases]',
        `* = host=${server.hostname} port=${server.port || 5432} user=${user} password=${password}`,
        '[pgbouncer]',
        'listen_addr = 127.0.0.1',
        `listen_port = ${port}`,
        'unix_socket_dir =',
        'pool_mode = transaction',
        'auth_type = trust',
        `auth_file = ${join(dir, 'userlist.txt')}`,
        'max_client_conn = 1000',
        'default_pool_size = 40',
        // pg sends extra_float_digits only when asked; the in-process sandbox's own pool (a dev stand-in)
        // still sends its settings as `options`. The service sends none (its settings ride with each transaction).
        'ignore_startup_parameters = extra_float_digits, options',
        `logfile = ${join(dir, 'pgbouncer.log')}`,
        `pidfile = ${pidFile}`,
        '',
      ].join('\n'),
    );
    if (asRoot) {
      const [uid, gid] = await Promise.all([run('id', ['-u', 'postgres']), run('id', ['-g', 'postgres'])]);
      for (const file of [dir, config, join(dir, 'userlist.txt')]) await chown(file, Number(uid.stdout), Number(gid.stdout));
    }
    await start();
  } catch (err) {
    await stop().catch(() => undefined);
    await rm(dir, { recursive: true, force: true });
    throw err;
  }

  return {
    port,
    pooledUrl: (directUrl) => {
      const url = new URL(directUrl);
      url.hostname = '127.0.0.1';
      url.port = String(port);
      return url.toString();
    },
    down: stop,
    start,
    stop: async () => {
      try {
        await stop();
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    },
  };
}
