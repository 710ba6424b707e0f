import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { resolve } from 'node:path';
import { PSP_KEY } from './test-app';
import { throughPooler } from './test-run';

const MAIN = resolve(process.cwd(), 'dist/src/main.js');
/** Required with DATABASE_URL (the dev default is refused there); a test may override it, or pass '' to leave it unset. */
const WEBHOOK_SECRET = `whsec_${Buffer.from('service-process-test-webhook-secret').toString('base64')}`;
const START_DEADLINE_MS = 60_000;

export interface ServiceProcess {
  child: ChildProcess;
  url: string;
  output: () => string;
  /** Resolves with the exit code once the process has gone. */
  exited: Promise<number | null>;
  kill(signal: NodeJS.Signals): Promise<number | null>;
}

/** FULFILMENT_API_TOKEN of the fulfilment processes tests start, and the fetch options its /shipments and /metrics need. */
export const FULFILMENT_TOKEN = 'fulfilment-test-token-0123456789';
export const FULFILMENT_AUTH = { headers: { authorization: `Bearer ${FULFILMENT_TOKEN}` } };

/** The built sandbox provider, as `npm run psp` runs it (PSP_PORT=0 for a free port); its URL without the /psp prefix. */
export const SANDBOX_MAIN = resolve(process.cwd(), 'dist/apps/psp-sandbox/src/main.js');

/**
 * The built service (`npm test` builds first) as its own OS process, as `npm start` runs it; `main`: another built entry.
 * `processGroup`: in a process group of its own, as a terminal runs it, so that a test can send the terminal's
 * Ctrl-C to the whole group (`process.kill(-child.pid, 'SIGINT')`).
 */
export async function startServiceProcess(
  env: Record<string, string>,
  { main = MAIN, processGroup = false }: { main?: string; processGroup?: boolean } = {},
): Promise<ServiceProcess> {
  const child = spawn(process.execPath, [main], {
    env: {
      PATH: process.env.PATH ?? '',
      PORT: '0',
      LOG_LEVEL: 'warn',
      PSP_WEBHOOK_SECRET: WEBHOOK_SECRET,
      // Likewise for PSP_API_KEY: the test apps' key, so that a sandbox process and a service on either side agree.
      PSP_API_KEY: PSP_KEY,
      // On a real database the in-process sandbox must be asked for; a test that names a provider does not.
      ...(env.PSP_BASE_URL || !env.DATABASE_URL ? {} : { PSP_SANDBOX: 'in-process' }),
      // As in test-app.ts: no slow path to the sandbox unless a test puts one there (and sets this).
      PSP_MAX_LATENCY_MS: '0',
      ...env,
      // TEST_PGBOUNCER=1: the service reaches its database through the pooler (the sandbox's own process does not).
      ...(env.DATABASE_URL && main === MAIN ? throughPooler(env.DATABASE_URL, env) : {}),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: processGroup,
  });
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const exited = once(child, 'exit').then(([code]) => code as number | null);
  const kill = async (signal: NodeJS.Signals) => {
    if (child.exitCode === null && child.signalCode === null) child.kill(signal);
    return exited;
  };
  const url = await new Promise<string>((resolveUrl, reject) => {
    const timer = setTimeout(() => reject(new Error(`service did not start in time:\n${output}`)), START_DEADLINE_MS);
    const onData = () => {
      const match = /listening on (http:\/\/localhost:\d+)/.exec(output);
      if (match) {
        clearTimeout(timer);
        resolveUrl(match[1].replace('localhost', '127.0.0.1'));
      }
    };
    child.stdout.on('data', onData);
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`service exited with ${code} before listening:\n${output}`));
    });
  }).catch(async (err: unknown) => {
    await kill('SIGKILL');
    throw err;
  });
  return { child, url, output: () => output, exited, kill };
}

/**
 * Runs the service expecting it to exit by itself (a refused start, a fault hook); resolves with its exit code and
 * output. Still running after `deadlineMs`, it is SIGKILLed (code null), so a test that fails never leaves it behind.
 * `cwd`: the working directory, where the service looks for its `.env` (default: this one); `main`: another built entry.
 */
export async function runServiceToExit(
  env: Record<string, string>,
  { cwd, main = MAIN, deadlineMs = START_DEADLINE_MS }: { cwd?: string; main?: string; deadlineMs?: number } = {},
): Promise<{ code: number | null; output: string }> {
  const child = spawn(process.execPath, [main], {
    env: { PATH: process.env.PATH ?? '', PSP_WEBHOOK_SECRET: WEBHOOK_SECRET, PSP_API_KEY: PSP_KEY, ...env },
    cwd,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const overdue = setTimeout(() => child.kill('SIGKILL'), deadlineMs);
  const [code] = (await once(child, 'exit')) as [number | null];
  clearTimeout(overdue);
  return { code, output };
}
