/**
 * CPU time from /proc (Linux), in milliseconds of user + system time.
 *
 * The machine is shared: other sessions run their own PostgreSQL servers as the same `postgres` user,
 * so PostgreSQL's CPU is summed over ONE server only — its postmaster (from `postmaster.pid` in the
 * data directory) and every process below it — never over all processes of the user.
 * Used by bench/bench.ts and, through dist/, by the peer's runner in bench/peer/.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

/** USER_HZ: /proc reports CPU in clock ticks of 1/100 s on every Linux the project runs on (`getconf CLK_TCK`). */
const TICKS_PER_SECOND = 100;

interface ProcStat {
  ppid: number;
  /** utime + stime of the process (all its threads). */
  ticks: number;
  /** cutime + cstime: children it has reaped (backends that exited between two samples). */
  childTicks: number;
}

function readStat(pid: number): ProcStat | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined; // exited between the directory scan and the read
  }
  // Field 2 (comm) may contain spaces and parentheses: split after the last ')'. f[0] is field 3 (state).
  const f = text.slice(text.lastIndexOf(')') + 2).split(' ');
  return { ppid: Number(f[1]), ticks: Number(f[11]) + Number(f[12]), childTicks: Number(f[13]) + Number(f[14]) };
}

const toMs = (ticks: number) => (ticks * 1000) / TICKS_PER_SECOND;

/** CPU of one process (all threads); 0 when it is gone. */
export function processCpuMs(pid: number | undefined): number {
  const stat = pid ? readStat(pid) : undefined;
  return stat ? toMs(stat.ticks) : 0;
}

/** The postmaster's pid: first line of postmaster.pid in the data directory. */
export function postmasterPid(dataDir: string): number {
  const pid = Number(readFileSync(join(dataDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
  if (!Number.isInteger(pid) || pid <= 0) throw new Error(`no postmaster pid in ${dataDir}/postmaster.pid`);
  return pid;
}

/**
 * CPU of a PostgreSQL server: the postmaster, its live descendants (backends, checkpointer, walwriter…),
 * and the children it has already reaped (its cutime + cstime), found by a full /proc scan of parent pids.
 */
export function postgresCpuMs(postmaster: number): number {
  const stats = new Map<number, ProcStat>();
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const stat = readStat(Number(name));
    if (stat) stats.set(Number(name), stat);
  }
  const root = stats.get(postmaster);
  if (!root) return 0;
  let ticks = root.ticks + root.childTicks;
  const inTree = new Set([postmaster]);
  // Parents have smaller pids except after pid wrap-around: iterate until no process is added.
  for (let added = true; added;) {
    added = false;
    for (const [pid, stat] of stats) {
      if (!inTree.has(pid) && inTree.has(stat.ppid)) {
        inTree.add(pid);
        ticks += stat.ticks;
        added = true;
      }
    }
  }
  return toMs(ticks);
}

/** CPU of this process (the load generator), from the runtime rather than /proc. */
export function selfCpuMs(): number {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1000;
}
