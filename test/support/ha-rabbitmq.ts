/**
 * A three-node RabbitMQ cluster (Debian's `rabbitmq-server`, 3.10 on Erlang 25), as users who outgrow one node run
 * it: quorum queues replicated on every node, clients given every node's URL. Each node runs as the `rabbitmq` user
 * in the foreground, in a process group of its own (so that a crash is one SIGKILL to the group: beam, its port
 * helpers and all), with its own ports; the three share one Erlang cookie ($HOME in the temp dir, read by the CLI too)
 * and one epmd of their own on a free port. Stopped by pid and process group, the temp dir removed, also when
 * starting fails.
 *
 * `net_ticktime = 10` and `cluster_partition_handling = pause_minority`, as docs/running-it.md#beyond-one-node
 * recommends: with the defaults (60 s, ignore) a frozen node (SIGSTOP) blocks the survivors' channels for about a
 * minute; with these the survivors drop it after ~10 s. Woken, a frozen node reconnects at once and most often does
 * not pause (it never counted itself a minority): the cluster stays partitioned until it is restarted (`restartNode`).
 * autoheal would restart the other side instead — measured: the woken node, holding a stale client connection, won.
 *
 * Node built-ins only (like ./rabbitmq): a harness must not depend on the code it tests.
 */
import { type ChildProcess, execFile } from 'node:child_process';
import { chmod, chown, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { accepts, alive, freePort, killGroup, spawnGrouped, stopGroup, untilTrue } from './ha-postgres';

const run = promisify(execFile);
const BIN = '/usr/lib/rabbitmq/bin';
const START_DEADLINE_MS = 120_000;
const STOP_DEADLINE_MS = 30_000;
const NODES = 3;

export interface ClusterNode {
  /** Erlang node name, `name@localhost`. */
  name: string;
  port: number;
  /** `amqp://guest:guest@127.0.0.1:PORT` (guest logs in from loopback only). */
  url: string;
}

export interface RabbitCluster {
  nodes: ClusterNode[];
  /** Every node's URL, comma-separated, as AMQP_URL takes them. */
  urlList: string;
  dir: string;
  /** The index (0..2) of the node holding `queue`'s quorum leader. */
  queueLeader(queue: string): Promise<number>;
  /** Messages ready + unacknowledged in `queue`, as a running node reports it (refreshed every 500 ms: poll). */
  queueDepth(queue: string): Promise<{ ready: number; unacked: number }>;
  /** A node's machine gone: SIGKILL to its whole process group; its data stays for `startNode`. */
  killNode(index: number): Promise<void>;
  /** The pid of a node's Erlang VM (beam.smp), 0 when it has none. */
  beamPid(index: number): Promise<number>;
  /** SIGSTOP (frozen: alive to TCP, silent to everyone) or SIGCONT to every process of the node. */
  freezeNode(index: number, frozen: boolean): void;
  /** Starts a node again on its data; it rejoins the cluster. */
  startNode(index: number): Promise<void>;
  /** `rabbitmqctl stop`, then started again on its data: a partition's recovery, for the side not trusted. */
  restartNode(index: number): Promise<void>;
  /** The nodes `index` records a partition with (rabbit_node_monitor's view; empty when none or when it is paused). */
  partitions(index: number): Promise<string[]>;
  /** Nodes the cluster counts as running, per a node that answers (or per node `from`: a woken node's own view can be stale). */
  runningNodes(from?: number): Promise<string[]>;
  pids(): number[];
  stop(): Promise<void>;
}

export async function startRabbitCluster(): Promise<RabbitCluster> {
  const dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-ha-rmq-'));
  await chmod(dir, 0o755);
  const epmdPort = await freePort();
  const tag = `${process.pid}-${epmdPort}`;
  const specs: { name: string; port: number; distPort: number }[] = [];
  for (let i = 1; i <= NODES; i++) specs.push({ name: `io-ha${i}-${tag}@localhost`, port: await freePort(), distPort: await freePort() });
  const asRoot = process.getuid?.() === 0;
  const ids: { uid?: number; gid?: number } = asRoot
    ? await Promise.all([run('id', ['-u', 'rabbitmq']), run('id', ['-g', 'rabbitmq'])]).then(([u, g]) => ({
        uid: Number(u.stdout),
        gid: Number(g.stdout),
      }))
    : {};
  const baseEnv = {
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    // One cookie for the three nodes and the CLI, in $HOME.
    HOME: dir,
    LANG: 'C.UTF-8',
    ERL_EPMD_PORT: String(epmdPort),
    ERL_EPMD_ADDRESS: '127.0.0.1',
    RABBITMQ_NODE_IP_ADDRESS: '127.0.0.1',
    RABBITMQ_ENABLED_PLUGINS_FILE: join(dir, 'enabled_plugins'),
    RABBITMQ_CONFIG_FILE: join(dir, 'rabbitmq'),
    RABBITMQ_CONF_ENV_FILE: join(dir, 'rabbitmq-env.conf'),
    RABBITMQ_ADVANCED_CONFIG_FILE: join(dir, 'advanced.config'),
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS: '-kernel inet_dist_use_interface {127,0,0,1}',
  };
  const nodeEnv = (i: number) => ({
    ...baseEnv,
    RABBITMQ_NODENAME: specs[i].name,
    RABBITMQ_NODE_PORT: String(specs[i].port),
    RABBITMQ_DIST_PORT: String(specs[i].distPort),
    RABBITMQ_MNESIA_BASE: join(dir, `mnesia${i + 1}`),
    RABBITMQ_LOG_BASE: join(dir, `log${i + 1}`),
    RABBITMQ_PID_FILE: join(dir, `node${i + 1}.pid`),
  });
  const asRabbit = (command: string, args: string[]): [string, string[]] =>
    asRoot ? ['setpriv', ['--reuid=rabbitmq', '--regid=rabbitmq', '--init-groups', command, ...args]] : [command, args];
  const ctl = (i: number, args: string[], timeoutMs = STOP_DEADLINE_MS) =>
    run(join(BIN, 'rabbitmqctl'), ['-n', specs[i].name, ...args], { env: nodeEnv(i), cwd: dir, timeout: timeoutMs, ...ids });

  let epmd: ChildProcess | undefined;
  const nodes: (ChildProcess | undefined)[] = [];
  const running = (i: number) => {
    const child = nodes[i];
    return child?.pid !== undefined && child.exitCode === null && child.signalCode === null;
  };

  const startNode = async (i: number) => {
    await rm(join(dir, `node${i + 1}.pid`), { force: true });
    const [command, args] = asRabbit(join(BIN, 'rabbitmq-server'), []);
    nodes[i] = await spawnGrouped(command, args, join(dir, `node${i + 1}.out`), { env: nodeEnv(i), cwd: dir });
    await untilTrue(
      `node ${i + 1} accepts AMQP on ${specs[i].port}`,
      START_DEADLINE_MS,
      async () => {
        if (!running(i)) throw new Error(`rabbitmq: node ${i + 1} exited`);
        return accepts(specs[i].port);
      },
      250,
    );
  };

  const beamPid = async (i: number) => Number((await readFile(join(dir, `node${i + 1}.pid`), 'utf8').catch(() => '')).trim());
  const untilBeamGone = async (i: number, beam: number) => {
    if (beam > 0) await untilTrue(`node ${i + 1}'s beam gone`, 10_000, () => !alive(beam), 20);
  };

  const killNode = async (i: number) => {
    const child = nodes[i];
    nodes[i] = undefined;
    if (child?.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
    const gone = new Promise((resolve) => child.once('exit', resolve));
    killGroup(child.pid, 'SIGKILL');
    await gone;
    // The beam (a child of the wrapper shell) dies with the group; wait for it too.
    await untilBeamGone(i, await beamPid(i));
  };

  const restartNode = async (i: number) => {
    const beam = await beamPid(i);
    await ctl(i, ['stop']).catch(() => undefined);
    await stopGroup(nodes[i], STOP_DEADLINE_MS);
    nodes[i] = undefined;
    await untilBeamGone(i, beam);
    await startNode(i);
  };

  const stop = async () => {
    await Promise.all(
      specs.map(async (_, i) => {
        // A frozen node cannot stop: wake it first.
        if (nodes[i]?.pid !== undefined) killGroup(nodes[i].pid, 'SIGCONT');
        if (running(i)) await ctl(i, ['stop']).catch(() => undefined);
        await stopGroup(nodes[i], STOP_DEADLINE_MS);
        await killNode(i);
      }),
    );
    await stopGroup(epmd, 5_000);
    await rm(dir, { recursive: true, force: true });
  };

  const frozen = new Set<number>();
  /** The first answer of a running node to a CLI call: a stopped or frozen node is skipped. */
  const ask = async (args: string[], only?: number): Promise<string> => {
    let lastError: unknown;
    for (let i = 0; i < NODES; i++) {
      if (!running(i) || frozen.has(i) || (only !== undefined && i !== only)) continue;
      try {
        return (await ctl(i, args, 15_000)).stdout;
      } catch (err) {
        lastError = err;
      }
    }
    throw new Error(`rabbitmq: no node answered ${args.join(' ')}: ${(lastError as Error | undefined)?.message}`);
  };
  const nodeNames = (stdout: string) => [...stdout.matchAll(/'([^']+)'/g)].map((m) => m[1]);
  const runningNodes = async (from?: number) => nodeNames(await ask(['eval', 'rabbit_nodes:all_running().'], from));
  const partitions = async (i: number) => nodeNames(await ask(['eval', 'rabbit_node_monitor:partitions().'], i));

  try {
    await writeFile(join(dir, 'enabled_plugins'), '[].\n');
    await writeFile(
      join(dir, 'rabbitmq.conf'),
      [
        'collect_statistics_interval = 500',
        'net_ticktime = 10',
        'cluster_partition_handling = pause_minority',
        'cluster_formation.peer_discovery_backend = classic_config',
        ...specs.map((spec, i) => `cluster_formation.classic_config.nodes.${i + 1} = ${spec.name}`),
        '',
      ].join('\n'),
    );
    // One cookie for the nodes and the CLI, written before any starts (a node would make its own otherwise).
    await writeFile(join(dir, '.erlang.cookie'), `io-ha-${tag}-${Date.now()}`, { mode: 0o400 });
    await writeFile(join(dir, 'rabbitmq-env.conf'), '');
    await writeFile(join(dir, 'advanced.config'), '[].\n');
    const { uid, gid } = ids;
    if (uid !== undefined && gid !== undefined) {
      for (const file of ['', '.erlang.cookie', 'enabled_plugins', 'rabbitmq.conf', 'rabbitmq-env.conf', 'advanced.config'])
        await chown(join(dir, file), uid, gid);
    }
    const [command, args] = asRabbit('epmd', ['-port', String(epmdPort), '-address', '127.0.0.1']);
    epmd = await spawnGrouped(command, args, join(dir, 'epmd.out'), { env: baseEnv });
    await untilTrue(`epmd accepts on ${epmdPort}`, 10_000, () => accepts(epmdPort));
    // The first node forms the cluster; the other two find it in the config (peer discovery) and join it as they boot,
    // with no CLI round trips (stop_app, join_cluster, start_app: ~80 s for two nodes on a loaded 2-core machine).
    await startNode(0);
    await Promise.all([startNode(1), startNode(2)]);
    await untilTrue(
      'three nodes running in one cluster',
      START_DEADLINE_MS,
      async () => (await runningNodes().catch(() => [])).length === NODES,
      500,
    );
  } catch (err) {
    const logs = await Promise.all(
      specs.map(
        async (s, i) => `--- node ${i + 1} ---\n${(await readFile(join(dir, `node${i + 1}.out`), 'utf8').catch(() => '')).slice(-2000)}`,
      ),
    );
    await stop();
    throw new Error(`${(err as Error).message}\n${logs.join('\n')}`, { cause: err });
  }

  return {
    nodes: specs.map((s) => ({ name: s.name, port: s.port, url: `amqp://guest:guest@127.0.0.1:${s.port}` })),
    urlList: specs.map((s) => `amqp://guest:guest@127.0.0.1:${s.port}`).join(','),
    dir,
    queueLeader: async (queue) => {
      const stdout = await ask(['list_queues', '-q', '--no-table-headers', 'name', 'leader']);
      const line = stdout.split('\n').find((row) => row.split('\t')[0] === queue);
      const index = specs.findIndex((s) => s.name === line?.split('\t')[1]?.trim());
      if (index < 0) throw new Error(`rabbitmq: no leader for ${queue} in ${JSON.stringify(stdout)}`);
      return index;
    },
    queueDepth: async (queue) => {
      const stdout = await ask(['list_queues', '-q', '--no-table-headers', 'name', 'messages_ready', 'messages_unacknowledged']);
      const line = stdout.split('\n').find((row) => row.split('\t')[0] === queue);
      if (!line) throw new Error(`rabbitmq: no queue ${queue}`);
      const [, ready, unacked] = line.split('\t');
      return { ready: Number(ready), unacked: Number(unacked) };
    },
    killNode,
    beamPid,
    freezeNode: (i, freeze) => {
      const pid = nodes[i]?.pid;
      if (pid === undefined) return;
      killGroup(pid, freeze ? 'SIGSTOP' : 'SIGCONT');
      if (freeze) frozen.add(i);
      else frozen.delete(i);
    },
    startNode,
    restartNode,
    partitions,
    runningNodes,
    pids: () => [epmd, ...nodes].map((c) => c?.pid).filter((pid): pid is number => pid !== undefined),
    stop,
  };
}
