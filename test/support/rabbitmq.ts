/**
 * A real RabbitMQ (Debian's `rabbitmq-server`, 3.10 on Erlang 25) for the broker suite: one node per call, as the
 * `rabbitmq` user, everything (data, logs, pid file, Erlang cookie) in a temp dir it owns, on free ports, with its
 * own node name and its OWN epmd on a free port (ERL_EPMD_PORT): nothing shared with another run or another node on
 * this machine, and nothing left behind — the node and the epmd are stopped by pid, the temp dir removed, even when
 * starting fails.
 *
 * Node built-ins only (like ./pgbouncer): a harness must not depend on the code it tests.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { chown, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);
const BIN = '/usr/lib/rabbitmq/bin';
const START_DEADLINE_MS = 60_000;
const STOP_DEADLINE_MS = 30_000;

export interface QueueDepth {
  /** Waiting to be delivered. */
  ready: number;
  /** Delivered to a consumer, not yet acked (they come back if its channel closes). */
  unacked: number;
}

export interface RabbitMq {
  /** `amqp://guest:guest@127.0.0.1:PORT` (guest logs in from loopback only). */
  url: string;
  port: number;
  /** The temp dir holding everything of this node (removed by `stop`). */
  dir: string;
  /** The node's pid while it runs (a test that must see it die kills this). */
  pid(): number | undefined;
  /** The pid of the epmd this harness started for the node. */
  epmdPid(): number | undefined;
  /** Stops the node and keeps its data: durable queues and persistent messages survive to `startBroker`. */
  stopBroker(): Promise<void>;
  /** SIGKILLs the node by its pid (a crash, or a machine gone: no clean shutdown) and waits until it is gone; data kept. */
  killBroker(): Promise<void>;
  /** Starts the node again on the same ports and data. */
  startBroker(): Promise<void>;
  restart(): Promise<void>;
  /**
   * The queue's depth as the broker reports it; rejects when the queue does not exist. The broker refreshes these
   * counts periodically (every 500 ms here: collect_statistics_interval), so poll: `untilQueueDepth`.
   */
  queueDepth(queue: string): Promise<QueueDepth>;
  /** Closes every client connection (as a network cut would): their unacked deliveries go back to their queues. */
  closeAllConnections(): Promise<void>;
  /** Polls `queueDepth` until it equals `expected`, or rejects after the deadline with the last depth seen. */
  untilQueueDepth(queue: string, expected: QueueDepth, deadlineMs?: number): Promise<void>;
  /** Deletes a queue with whatever it holds (its consumers are cancelled by the broker), as an operator would. */
  deleteQueue(queue: string): Promise<void>;
  /** `rabbitmq-queues quorum_status QUEUE` as text: each member's Raft state (leader, follower, …), for a failure's message. */
  quorumStatus(queue: string): Promise<string>;
  /** Stops the node and its epmd for good, removes the temp dir. */
  stop(): Promise<void>;
}

export const rabbitMqInstalled = async (): Promise<boolean> =>
  run(join(BIN, 'rabbitmqctl'), ['version']).then(
    () => true,
    () => false,
  );

const freePort = () =>
  new Promise<number>((resolvePort, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolvePort(port));
    });
  });

const accepts = (port: number) =>
  new Promise<boolean>((resolve) => {
    const socket = connect(port, '127.0.0.1');
    socket.once('connect', () => (socket.destroy(), resolve(true)));
    socket.once('error', () => resolve(false));
  });

export const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

const until = async (what: string, deadlineMs: number, done: () => Promise<boolean> | boolean) => {
  const deadline = Date.now() + deadlineMs;
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`rabbitmq: ${what} within ${deadlineMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
};

export async function startRabbitMq(): Promise<RabbitMq> {
  const dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-rabbitmq-'));
  const [port, distPort, epmdPort] = [await freePort(), await freePort(), await freePort()];
  const node = `io-test-${process.pid}-${port}@localhost`;
  const pidFile = join(dir, 'pid');
  // As root, the node runs as the rabbitmq user (as Debian's wrapper would), which must own the dir.
  const asRoot = process.getuid?.() === 0;
  const ids: { uid?: number; gid?: number } = asRoot
    ? await Promise.all([run('id', ['-u', 'rabbitmq']), run('id', ['-g', 'rabbitmq'])]).then(([u, g]) => ({
        uid: Number(u.stdout),
        gid: Number(g.stdout),
      }))
    : {};
  const env = {
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    // The Erlang cookie is created in (and read from) $HOME: the temp dir, so rabbitmqctl of this run alone talks to it.
    HOME: dir,
    LANG: 'C.UTF-8',
    ERL_EPMD_PORT: String(epmdPort),
    RABBITMQ_NODENAME: node,
    RABBITMQ_NODE_IP_ADDRESS: '127.0.0.1',
    RABBITMQ_NODE_PORT: String(port),
    RABBITMQ_DIST_PORT: String(distPort),
    RABBITMQ_MNESIA_BASE: join(dir, 'mnesia'),
    RABBITMQ_LOG_BASE: join(dir, 'log'),
    RABBITMQ_PID_FILE: pidFile,
    RABBITMQ_ENABLED_PLUGINS_FILE: join(dir, 'enabled_plugins'),
    RABBITMQ_CONFIG_FILE: join(dir, 'rabbitmq'),
    RABBITMQ_CONF_ENV_FILE: join(dir, 'rabbitmq-env.conf'),
    RABBITMQ_ADVANCED_CONFIG_FILE: join(dir, 'advanced.config'),
  };
  const ctl = (args: string[], timeoutMs = STOP_DEADLINE_MS) =>
    run(join(BIN, 'rabbitmqctl'), ['-n', node, ...args], { env, cwd: dir, timeout: timeoutMs, ...ids });

  let epmd: ChildProcess | undefined;
  let nodePid: number | undefined;

  const startBroker = async () => {
    await rm(pidFile, { force: true });
    await run(join(BIN, 'rabbitmq-server'), ['-detached'], { env, cwd: dir, ...ids });
    // `wait` returns once the pid file's process runs the rabbit application (about 10 s on this machine).
    await until('wrote its pid file', START_DEADLINE_MS, async () => {
      nodePid = Number((await readFile(pidFile, 'utf8').catch(() => '')).trim()) || undefined;
      return nodePid !== undefined;
    });
    await ctl(['wait', pidFile, '--timeout', String(START_DEADLINE_MS / 1000)], START_DEADLINE_MS + 5_000);
    await until(`accepts AMQP on ${port}`, START_DEADLINE_MS, () => accepts(port));
  };

  const stopBroker = async () => {
    const stopping = nodePid;
    if (stopping === undefined) return;
    nodePid = undefined;
    // A clean stop (rabbitmqctl stop PIDFILE returns once that process is gone); SIGKILL by pid if it hangs.
    await ctl(['stop', pidFile]).catch(() => undefined);
    await until('stopped', STOP_DEADLINE_MS, () => !alive(stopping)).catch(() => process.kill(stopping, 'SIGKILL'));
    await until('gone after SIGKILL', 5_000, () => !alive(stopping)).catch(() => undefined);
  };

  const killBroker = async () => {
    const killing = nodePid;
    if (killing === undefined) return;
    nodePid = undefined;
    process.kill(killing, 'SIGKILL');
    await until('gone after SIGKILL', 5_000, () => !alive(killing));
  };

  const stopEpmd = async () => {
    const child = epmd;
    epmd = undefined;
    if (child?.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGKILL');
    await exited;
  };

  const removeAll = async () => {
    await stopBroker().catch(() => undefined);
    await stopEpmd();
    await rm(dir, { recursive: true, force: true });
  };

  try {
    await writeFile(join(dir, 'enabled_plugins'), '[].\n');
    // Queue counts (list_queues) are refreshed on this interval: 5 s by default, too coarse for a test's poll.
    await writeFile(join(dir, 'rabbitmq.conf'), 'collect_statistics_interval = 500\n');
    await writeFile(join(dir, 'rabbitmq-env.conf'), '');
    await writeFile(join(dir, 'advanced.config'), '[].\n');
    const { uid, gid } = ids;
    if (uid !== undefined && gid !== undefined) {
      for (const file of ['', 'enabled_plugins', 'rabbitmq.conf', 'rabbitmq-env.conf', 'advanced.config']) {
        await chown(join(dir, file), uid, gid);
      }
    }
    // Our own epmd, in the foreground as our child: its pid is ours to stop, and no other node registers with it.
    epmd = spawn('epmd', ['-port', String(epmdPort), '-address', '127.0.0.1'], { env, stdio: 'ignore', ...ids });
    await until(`epmd accepts on ${epmdPort}`, 10_000, () => {
      if (epmd?.exitCode !== null) throw new Error(`rabbitmq: epmd exited with ${epmd?.exitCode}`);
      return accepts(epmdPort);
    });
    await startBroker();
  } catch (err) {
    const log = await readFile(join(dir, 'log', `${node}.log`), 'utf8').catch(() => '');
    await removeAll();
    throw new Error(`${(err as Error).message}${log ? `\n--- node log (tail) ---\n${log.slice(-3000)}` : ''}`, { cause: err });
  }

  const queueDepth = async (queue: string): Promise<QueueDepth> => {
    const { stdout } = await ctl(['list_queues', '-q', '--no-table-headers', 'name', 'messages_ready', 'messages_unacknowledged']);
    const line = stdout.split('\n').find((row) => row.split('\t')[0] === queue);
    if (!line) throw new Error(`rabbitmq: no queue ${queue}`);
    const [, ready, unacked] = line.split('\t');
    return { ready: Number(ready), unacked: Number(unacked) };
  };

  return {
    url: `amqp://guest:guest@127.0.0.1:${port}`,
    port,
    dir,
    pid: () => nodePid,
    epmdPid: () => epmd?.pid,
    stopBroker,
    killBroker,
    startBroker,
    restart: async () => {
      await stopBroker();
      await startBroker();
    },
    queueDepth,
    deleteQueue: async (queue) => {
      await ctl(['delete_queue', queue]);
    },
    quorumStatus: async (queue) => {
      const { stdout } = await run(join(BIN, 'rabbitmq-queues'), ['-n', node, '-q', 'quorum_status', queue], {
        env,
        cwd: dir,
        timeout: STOP_DEADLINE_MS,
        ...ids,
      }).catch((err: { stdout?: string; stderr?: string; message: string }) => ({
        stdout: `${err.message} ${err.stdout ?? ''} ${err.stderr ?? ''}`,
      }));
      return stdout;
    },
    closeAllConnections: async () => {
      await ctl(['close_all_connections', 'closed by the test harness']);
    },
    untilQueueDepth: async (queue, expected, deadlineMs = 30_000) => {
      let last: QueueDepth | undefined;
      await until(`${queue} at ${JSON.stringify(expected)}`, deadlineMs, async () => {
        last = await queueDepth(queue);
        return last.ready === expected.ready && last.unacked === expected.unacked;
      }).catch((err: Error) => {
        throw new Error(`${err.message} (last seen ${JSON.stringify(last)})`);
      });
    },
    stop: removeAll,
  };
}
