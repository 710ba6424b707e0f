/**
 * A replicated PostgreSQL with automatic failover, as users who outgrow one machine run it: Debian's Patroni (3.0)
 * managing three PostgreSQL 15 members, etcd (3.4, one member) as its consensus store, and HAProxy (2.6) in front,
 * routing to whichever member answers Patroni's `GET /primary` with 200 — pg has no multi-host URLs, so clients reach
 * the primary through the proxy (docs/running-it.md#beyond-one-node).
 *
 * Everything on free ports, in a temp dir of its own, members running as the postgres user (PostgreSQL refuses root),
 * each with its own socket dir; every process spawned in a process group of its own and stopped by that group's id
 * (Patroni starts each postmaster in a new session: that session is stopped by its own id too), the temp dir removed,
 * also when starting fails. `synchronous`: Patroni's synchronous_mode (a commit is acknowledged once a standby has it)
 * or its default, asynchronous replication.
 *
 * Node built-ins only (like ./pgbouncer and ./rabbitmq): a harness must not depend on the code it tests.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { chmod, chown, mkdir, mkdtemp, open, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);
const BIN_DIR = '/usr/lib/postgresql/15/bin';
/** Slow on a shared 2-core machine: the first member bootstraps in ~6 s, the other two clone it in ~8 s more. */
const START_DEADLINE_MS = 120_000;
const STOP_DEADLINE_MS = 30_000;
/** Patroni's leader key lives this long without renewal: a crashed primary is replaced after about this. */
const TTL_SECONDS = 10;

export const APP_USER = 'app';
export const APP_PASSWORD = 'app-password-ha';
export const APP_DATABASE = 'app';

export interface HaMember {
  name: string;
  pgPort: number;
  restPort: number;
}

/** A member as Patroni's `GET /cluster` reports it. */
export interface MemberState {
  name: string;
  /** leader, replica or sync_standby. */
  role: string;
  state: string;
  lag?: number | string;
}

export interface HaPostgres {
  /** The application's database as a client reaches it: through HAProxy, to whichever member is primary. */
  url: string;
  /** The same database on one member directly (for checks; a replica answers read-only). */
  memberUrl(name: string): string;
  members: HaMember[];
  /** The temp dir holding everything (removed by `stop`). */
  dir: string;
  /** Patroni's view of the cluster (`GET /cluster` of the first member that answers). */
  cluster(): Promise<MemberState[]>;
  /** The leader's name, per Patroni; undefined while there is none. */
  leader(): Promise<string | undefined>;
  /** The members HAProxy routes clients to right now (its checks' view): the primary alone, or none mid-failover. */
  routedTo(): Promise<string[]>;
  /** Polls until one leader and two running replicas (one of them a sync standby in synchronous mode). */
  untilHealthy(deadlineMs?: number): Promise<MemberState[]>;
  /**
   * The member's machine gone at once: SIGKILL to its Patroni and to its postmaster's whole session (the backends,
   * WAL senders and the rest die with it). Nothing shuts down cleanly; its data stays for `startMember`.
   */
  crashMember(name: string): Promise<void>;
  /** Starts a member's Patroni again on its data: it rejoins (pg_rewind'ing a former primary) as a replica. */
  startMember(name: string): Promise<void>;
  /** SIGSTOP (or SIGCONT) to the member's WAL sender processes: its replicas stop receiving WAL, commits go on. */
  stallWalSenders(name: string, stalled: boolean): Promise<number>;
  /** The member's postmaster pid while it runs (its data dir's postmaster.pid): a bench sums its server's CPU from it. */
  postmasterPid(name: string): Promise<number | undefined>;
  /** Every pid this harness runs right now (etcd, HAProxy, each Patroni and postmaster): a test checks they are gone after `stop`. */
  pids(): Promise<number[]>;
  /** Stops everything for good (by pid and process group), removes the temp dir. */
  stop(): Promise<void>;
}

export const haPostgresInstalled = async (): Promise<boolean> =>
  Promise.all(['patroni', 'etcd', 'haproxy'].map((bin) => run('sh', ['-c', `command -v ${bin}`]))).then(
    () => true,
    () => false,
  );

export const freePort = () =>
  new Promise<number>((resolvePort, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolvePort(port));
    });
  });

export const accepts = (port: number) =>
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

/** Signals a whole process group; a group already gone is no error. */
export const killGroup = (pgid: number, signal: NodeJS.Signals) => {
  try {
    process.kill(-pgid, signal);
  } catch {
    // gone already
  }
};

export const untilTrue = async (what: string, deadlineMs: number, done: () => Promise<boolean> | boolean, intervalMs = 100) => {
  const deadline = Date.now() + deadlineMs;
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`ha: ${what} not within ${deadlineMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
};

/** A child in a process group of its own (its pid is the group's id), output appended to `logFile`. */
export async function spawnGrouped(
  command: string,
  args: string[],
  logFile: string,
  options: { env?: NodeJS.ProcessEnv; cwd?: string } = {},
): Promise<ChildProcess> {
  const log = await open(logFile, 'a');
  try {
    const child = spawn(command, args, { ...options, stdio: ['ignore', log.fd, log.fd], detached: true });
    child.unref();
    await new Promise<void>((resolve, reject) => {
      child.once('spawn', resolve);
      child.once('error', reject);
    });
    return child;
  } finally {
    await log.close();
  }
}

const exited = (child: ChildProcess) => child.exitCode !== null || child.signalCode !== null;

/** SIGTERM to the child's group, SIGKILL after `graceMs`; resolves once the child has exited. */
export async function stopGroup(child: ChildProcess | undefined, graceMs: number): Promise<void> {
  if (child?.pid === undefined || exited(child)) return;
  const gone = new Promise((resolve) => child.once('exit', resolve));
  killGroup(child.pid, 'SIGTERM');
  const overdue = setTimeout(() => killGroup(child.pid!, 'SIGKILL'), graceMs);
  await gone;
  clearTimeout(overdue);
}

const tail = async (file: string) => (await readFile(file, 'utf8').catch(() => '')).slice(-2500);

/** The process group (field 5 of /proc/PID/stat) of a pid, or undefined once it is gone. */
async function processGroupOf(pid: number): Promise<number | undefined> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => undefined);
  if (stat === undefined) return undefined;
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[2]);
}

export async function startHaPostgres({ synchronous }: { synchronous: boolean }): Promise<HaPostgres> {
  const dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-ha-pg-'));
  await chmod(dir, 0o755);
  const scope = `io-${process.pid}-${Date.now().toString(36)}`;
  const [etcdClient, etcdPeer, proxyPort] = [await freePort(), await freePort(), await freePort()];
  const members: HaMember[] = [];
  for (const name of ['pg1', 'pg2', 'pg3']) members.push({ name, pgPort: await freePort(), restPort: await freePort() });
  const asRoot = process.getuid?.() === 0;
  const [uid, gid] = asRoot
    ? await Promise.all([run('id', ['-u', 'postgres']), run('id', ['-g', 'postgres'])]).then(([u, g]) => [
        Number(u.stdout),
        Number(g.stdout),
      ])
    : [undefined, undefined];
  // Run as postgres through setpriv (which execs: the child's pid is Patroni's), HOME in the member's dir.
  const asPostgres = (command: string, args: string[]): [string, string[]] =>
    asRoot ? ['setpriv', ['--reuid=postgres', '--regid=postgres', '--init-groups', command, ...args]] : [command, args];

  let etcd: ChildProcess | undefined;
  let haproxy: ChildProcess | undefined;
  const patroni = new Map<string, ChildProcess>();
  const memberDir = (name: string) => join(dir, name);
  const member = (name: string) => {
    const found = members.find((m) => m.name === name);
    if (!found) throw new Error(`ha: no member ${name}`);
    return found;
  };

  const postmasterPid = async (name: string): Promise<number | undefined> => {
    const text = await readFile(join(memberDir(name), 'data', 'postmaster.pid'), 'utf8').catch(() => '');
    const pid = Number(text.split('\n')[0]);
    return pid > 0 && alive(pid) ? pid : undefined;
  };

  const startMember = async (name: string) => {
    const m = member(name);
    const [command, args] = asPostgres('patroni', [join(memberDir(name), 'patroni.yml')]);
    patroni.set(
      name,
      await spawnGrouped(command, args, join(dir, `${name}.log`), {
        env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: memberDir(name), LANG: 'C.UTF-8' },
        cwd: memberDir(name),
      }),
    );
    await untilTrue(`${name}'s REST API on ${m.restPort}`, START_DEADLINE_MS, () => accepts(m.restPort));
  };

  const stopPostmaster = async (name: string, signal: NodeJS.Signals) => {
    const pid = await postmasterPid(name);
    if (pid === undefined) return;
    const group = await processGroupOf(pid);
    if (group !== undefined && group > 1) killGroup(group, signal);
    else process.kill(pid, signal);
    await untilTrue(`${name}'s postmaster gone`, STOP_DEADLINE_MS, () => !alive(pid), 50);
  };

  const crashMember = async (name: string) => {
    const child = patroni.get(name);
    patroni.delete(name);
    const pid = await postmasterPid(name);
    // Its children too, by pid: a machine gone takes them all, and one stopped (stallWalSenders) would never notice
    // its postmaster died, outliving the test.
    const children = pid === undefined ? [] : await childrenOf(pid);
    if (child?.pid !== undefined && !exited(child)) {
      const gone = new Promise((resolve) => child.once('exit', resolve));
      killGroup(child.pid, 'SIGKILL');
      await gone;
    }
    if (pid !== undefined) {
      const group = await processGroupOf(pid);
      if (group !== undefined && group > 1) killGroup(group, 'SIGKILL');
      else process.kill(pid, 'SIGKILL');
      for (const c of children) if (alive(c.pid)) process.kill(c.pid, 'SIGKILL');
      await untilTrue(
        `${name}'s postmaster and its children gone`,
        STOP_DEADLINE_MS,
        () => ![pid, ...children.map((c) => c.pid)].some(alive),
        20,
      );
    }
  };

  const restGet = async (port: number, path: string): Promise<{ status: number; body: string }> => {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), 2_000);
    try {
      const res = await fetch(`http://127.0.0.1:${port}${path}`, { signal: controller.signal });
      return { status: res.status, body: await res.text() };
    } finally {
      clearTimeout(timer);
    }
  };

  const cluster = async (): Promise<MemberState[]> => {
    for (const m of members) {
      if (!patroni.has(m.name)) continue;
      const answer = await restGet(m.restPort, '/cluster').catch(() => undefined);
      if (answer?.status === 200) return (JSON.parse(answer.body) as { members: MemberState[] }).members;
    }
    return [];
  };

  const leader = async () => (await cluster()).find((m) => m.role === 'leader' && m.state === 'running')?.name;

  const untilHealthy = async (deadlineMs = START_DEADLINE_MS) => {
    let last: MemberState[] = [];
    await untilTrue(
      'one leader and two running replicas',
      deadlineMs,
      async () => {
        last = await cluster();
        const running = last.filter((m) => m.state === 'running' || m.state === 'streaming');
        const leaders = running.filter((m) => m.role === 'leader').length;
        const syncs = running.filter((m) => m.role === 'sync_standby').length;
        return running.length === 3 && leaders === 1 && (!synchronous || syncs === 1);
      },
      250,
    ).catch((err: Error) => {
      throw new Error(`${err.message}; last seen ${JSON.stringify(last)}`);
    });
    return last;
  };

  /** The members HAProxy routes to right now (`show stat` on its admin socket: servers whose status is UP). */
  const routedTo = () =>
    new Promise<string[]>((resolve, reject) => {
      const socket = connect(join(dir, 'haproxy.sock'));
      let text = '';
      socket.once('connect', () => socket.end('show stat\n'));
      socket.on('data', (chunk: Buffer) => (text += chunk.toString()));
      socket.once('error', reject);
      socket.once('close', () =>
        resolve(
          text
            .split('\n')
            .map((line) => line.split(','))
            .filter((fields) => fields[0] === 'pg_primary' && fields[1].startsWith('pg') && fields[17] === 'UP') // 17: status
            .map((fields) => fields[1]),
        ),
      );
    });

  /** The postmaster's children (each PostgreSQL process is a session of its own, so not reached through its group). */
  const childrenOf = async (postmaster: number): Promise<{ pid: number; cmdline: string }[]> => {
    const children: { pid: number; cmdline: string }[] = [];
    for (const entry of await readdir('/proc')) {
      if (!/^\d+$/.test(entry)) continue;
      const stat = await readFile(`/proc/${entry}/stat`, 'utf8').catch(() => '');
      const parent = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (parent !== postmaster) continue;
      children.push({ pid: Number(entry), cmdline: await readFile(`/proc/${entry}/cmdline`, 'utf8').catch(() => '') });
    }
    return children;
  };

  const stallWalSenders = async (name: string, stalled: boolean) => {
    const postmaster = await postmasterPid(name);
    if (postmaster === undefined) return 0;
    let signalled = 0;
    for (const { pid, cmdline } of await childrenOf(postmaster)) {
      if (!cmdline.includes('walsender')) continue;
      process.kill(pid, stalled ? 'SIGSTOP' : 'SIGCONT');
      signalled++;
    }
    return signalled;
  };

  const stop = async () => {
    // A WAL sender a failed test left stalled would hold its postmaster's shutdown (and outlive a SIGKILLed one).
    for (const m of members) {
      const postmaster = await postmasterPid(m.name).catch(() => undefined);
      if (postmaster !== undefined) for (const c of await childrenOf(postmaster)) process.kill(c.pid, 'SIGCONT');
    }
    // Patroni stops its PostgreSQL on SIGTERM; a postmaster left behind (Patroni killed, or too slow) is stopped by its session.
    await Promise.all(members.map(async (m) => stopGroup(patroni.get(m.name), STOP_DEADLINE_MS)));
    patroni.clear();
    for (const m of members) {
      await stopPostmaster(m.name, 'SIGCONT').catch(() => undefined);
      await stopPostmaster(m.name, 'SIGKILL').catch(() => undefined);
    }
    await stopGroup(haproxy, 5_000);
    await stopGroup(etcd, 5_000);
    await rm(dir, { recursive: true, force: true });
  };

  try {
    const etcdUrl = `http://127.0.0.1:${etcdClient}`;
    etcd = await spawnGrouped(
      'etcd',
      [
        ...['--name', 'etcd1', '--data-dir', join(dir, 'etcd')],
        ...['--listen-client-urls', etcdUrl, '--advertise-client-urls', etcdUrl],
        ...['--listen-peer-urls', `http://127.0.0.1:${etcdPeer}`, '--initial-advertise-peer-urls', `http://127.0.0.1:${etcdPeer}`],
        ...['--initial-cluster', `etcd1=http://127.0.0.1:${etcdPeer}`, '--initial-cluster-state', 'new', '--enable-v2=false'],
      ],
      join(dir, 'etcd.log'),
      { env: { PATH: process.env.PATH ?? '/usr/bin:/bin' } },
    );
    await untilTrue('etcd healthy', START_DEADLINE_MS, async () => {
      if (etcd && exited(etcd)) throw new Error(`ha: etcd exited\n${await tail(join(dir, 'etcd.log'))}`);
      return (await restGet(etcdClient, '/health').catch(() => undefined))?.status === 200;
    });

    const postBootstrap = join(dir, 'post_bootstrap.sh');
    await writeFile(
      postBootstrap,
      `#!/bin/sh\nset -e\npsql "$1" -v ON_ERROR_STOP=1 -c "CREATE ROLE ${APP_USER} LOGIN PASSWORD '${APP_PASSWORD}'" -c "CREATE DATABASE ${APP_DATABASE} OWNER ${APP_USER}"\n`,
      { mode: 0o755 },
    );
    for (const m of members) {
      const home = memberDir(m.name);
      await mkdir(home, { mode: 0o700 });
      // YAML is a superset of JSON: the config is written as JSON.
      const config = {
        scope,
        namespace: '/idempotent-orders-test/',
        name: m.name,
        log: { level: 'WARNING' },
        restapi: { listen: `127.0.0.1:${m.restPort}`, connect_address: `127.0.0.1:${m.restPort}` },
        etcd3: { hosts: `127.0.0.1:${etcdClient}` },
        bootstrap: {
          dcs: {
            ttl: TTL_SECONDS,
            loop_wait: 2,
            retry_timeout: 4,
            maximum_lag_on_failover: 1_048_576,
            synchronous_mode: synchronous,
            postgresql: {
              use_pg_rewind: true,
              parameters: {
                wal_level: 'replica',
                hot_standby: 'on',
                wal_log_hints: 'on',
                max_wal_senders: 10,
                max_replication_slots: 10,
                shared_buffers: '32MB',
                max_connections: 100,
                // The crashes here kill processes, not the machine: the OS keeps what was written, so fsync buys nothing but load.
                fsync: 'off',
              },
            },
          },
          initdb: [{ encoding: 'UTF8' }, { 'auth-local': 'trust' }, { 'auth-host': 'scram-sha-256' }],
          post_bootstrap: postBootstrap,
        },
        postgresql: {
          listen: `127.0.0.1:${m.pgPort}`,
          connect_address: `127.0.0.1:${m.pgPort}`,
          data_dir: join(home, 'data'),
          bin_dir: BIN_DIR,
          pgpass: join(home, 'pgpass'),
          // Without a fast checkpoint a replica's pg_basebackup waits for a spread one (95 s here).
          basebackup: [{ checkpoint: 'fast' }],
          authentication: {
            superuser: { username: 'postgres', password: 'ha-superuser' },
            replication: { username: 'replicator', password: 'ha-replication' },
            rewind: { username: 'rewinder', password: 'ha-rewind' },
          },
          parameters: { unix_socket_directories: home },
          pg_hba: [
            'local all all trust',
            'host replication replicator 127.0.0.1/32 scram-sha-256',
            'host all all 127.0.0.1/32 scram-sha-256',
          ],
        },
      };
      await writeFile(join(home, 'patroni.yml'), JSON.stringify(config, null, 2), { mode: 0o600 });
    }
    if (uid !== undefined && gid !== undefined) {
      for (const file of [postBootstrap, ...members.flatMap((m) => [memberDir(m.name), join(memberDir(m.name), 'patroni.yml')])]) {
        await chown(file, uid, gid);
      }
    }

    const proxyConfig = join(dir, 'haproxy.cfg');
    await writeFile(
      proxyConfig,
      [
        'global',
        '    maxconn 400',
        `    stats socket ${join(dir, 'haproxy.sock')} mode 600 level operator`,
        'defaults',
        '    mode tcp',
        '    retries 2',
        '    timeout connect 2s',
        '    timeout client 30m',
        '    timeout server 30m',
        '    timeout check 1s',
        'listen pg_primary',
        `    bind 127.0.0.1:${proxyPort}`,
        '    option httpchk GET /primary',
        '    http-check expect status 200',
        // A member that stops answering 200 is out after 2 checks, and its open connections are cut.
        '    default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions',
        ...members.map((m) => `    server ${m.name} 127.0.0.1:${m.pgPort} maxconn 150 check port ${m.restPort}`),
        '',
      ].join('\n'),
    );
    haproxy = await spawnGrouped('haproxy', ['-f', proxyConfig], join(dir, 'haproxy.log'), {
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin' },
    });

    // The first member bootstraps the cluster; the other two clone it once it leads.
    await startMember('pg1');
    await untilTrue('pg1 leads', START_DEADLINE_MS, async () => {
      if (exited(patroni.get('pg1')!)) throw new Error(`ha: pg1's Patroni exited\n${await tail(join(dir, 'pg1.log'))}`);
      return (await leader()) === 'pg1';
    });
    await Promise.all([startMember('pg2'), startMember('pg3')]);
    const healthy = await untilHealthy();
    // HAProxy assumes every server up until its checks say otherwise: wait until it routes to the leader alone.
    const first = healthy.find((m) => m.role === 'leader')!.name;
    await untilTrue(`HAProxy routes to ${first} alone`, START_DEADLINE_MS, async () => (await routedTo()).join() === first);
  } catch (err) {
    const logs = (
      await Promise.all(['etcd', 'pg1', 'pg2', 'pg3', 'haproxy'].map(async (n) => `--- ${n} ---\n${await tail(join(dir, `${n}.log`))}`))
    ).join('\n');
    await stop();
    throw new Error(`${(err as Error).message}\n${logs}`, { cause: err });
  }

  const urlTo = (port: number) => `postgres://${APP_USER}:${APP_PASSWORD}@127.0.0.1:${port}/${APP_DATABASE}`;
  return {
    url: urlTo(proxyPort),
    memberUrl: (name) => urlTo(member(name).pgPort),
    members,
    dir,
    cluster,
    leader,
    untilHealthy,
    routedTo,
    crashMember,
    startMember,
    stallWalSenders,
    postmasterPid,
    pids: async () => {
      const postmasters = await Promise.all(members.map((m) => postmasterPid(m.name)));
      return [etcd, haproxy, ...patroni.values()]
        .map((c) => c?.pid)
        .concat(postmasters)
        .filter((pid): pid is number => pid !== undefined);
    },
    stop,
  };
}
