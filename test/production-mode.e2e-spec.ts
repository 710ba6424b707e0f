/**
 * Production mode means it (issue 38): the built service, started as `npm start` starts it, refuses every published
 * development default under NODE_ENV=production or with a real provider, names the variable, refuses hand-typed
 * secrets in production, and in development listens on loopback only (the dev key and the sandbox are this
 * machine's alone), saying where it listens.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { freePort } from '../src/common/free-port';
import { type ServiceProcess, startServiceProcess } from './support/service-process';
import { ALICE, createTestDatabase } from './support/test-app';
import { until } from './support/until';

const MAIN = resolve(process.cwd(), 'dist/src/main.js');
/** Generated as the docs say (openssl rand -hex 16, whsec_ + openssl rand -base64 32): what production accepts. */
const STRONG_KEYS = 'shop:3f9c2a7be41d8056c3e9f1a27b6d4e08';
const STRONG_WEBHOOK_SECRET = 'whsec_q3Xw8v0Zr7Kb2mYf5Tn1Lc9Hp4Ds6Ge0Ja8Ui2Oo3Ws=';
const DEV_KEY = 'dev-secret-change-me';
const DEV_WEBHOOK_SECRET = 'whsec_ZGV2LW9ubHktd2ViaG9vay1zZWNyZXQtY2hhbmdlISE=';
const DEV_PSP_KEY = 'sk_test_dev-only-psp-key-change-me';
/** A provider's secret key as the provider issues one. */
const STRONG_PSP_KEY = 'sk_live_8d2f6a1c9e4b7035f1a8c6e2d9b4f7a3';
/** A provider nobody answers at: start-up does not call it. */
const PROVIDER = 'http://127.0.0.1:9/psp';
const TEST_TIMEOUT_MS = 120_000;

/**
 * Runs the service until it exits by itself (a refused start) or says it listens: then it is stopped as a user
 * stops it (SIGTERM, which also stops an embedded PostgreSQL) and reported as 'listening', so that a start
 * that should have been refused fails the test and leaves nothing running.
 */
async function startOrRefusal(env: Record<string, string>, cwd: string): Promise<{ code: number | null | 'listening'; output: string }> {
  const child = spawn(process.execPath, [MAIN], {
    env: { PATH: process.env.PATH ?? '', PORT: '0', LOG_LEVEL: 'warn', EMBEDDED_PG_DIR: join(cwd, 'pg'), ...env },
    cwd,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  let listening = false;
  const exited = once(child, 'exit').then(([code]) => code as number | null);
  const onData = (chunk: Buffer) => {
    output += chunk.toString();
    if (!listening && output.includes('listening on')) {
      listening = true;
      child.kill('SIGTERM');
    }
  };
  child.stdout.on('data', onData);
  child.stderr.on('data', onData);
  const overdue = setTimeout(() => child.kill('SIGKILL'), 90_000);
  const code = await exited;
  clearTimeout(overdue);
  return { code: listening ? 'listening' : code, output };
}

/** The local addresses a listening TCP socket on `port` is bound to, from the kernel's own table (Linux). */
function boundAddresses(port: number): string[] {
  const hexPort = port.toString(16).toUpperCase().padStart(4, '0');
  const found: string[] = [];
  for (const [file, width] of [
    ['/proc/net/tcp', 8],
    ['/proc/net/tcp6', 32],
  ] as const) {
    for (const line of readFileSync(file, 'utf8').split('\n').slice(1)) {
      const [, local, , state] = line.trim().split(/\s+/);
      if (!local || state !== '0A') continue; // 0A: LISTEN
      const [address, portPart] = local.split(':');
      if (portPart !== hexPort || address.length !== width) continue;
      found.push(address);
    }
  }
  return found;
}
const LOOPBACK_V4 = '0100007F';
const ANY_V4 = '00000000';

describe('NODE_ENV=production refuses every published development default, naming the variable', () => {
  let dir: string;
  let embeddedPgPort: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-production-mode-'));
    // The embedded server runs as "postgres" when the tests run as root (CI): it must be able to enter the folder.
    await chmod(dir, 0o755);
    embeddedPgPort = String(await freePort());
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });
  const production = (env: Record<string, string>) =>
    startOrRefusal({ NODE_ENV: 'production', EMBEDDED_PG_PORT: embeddedPgPort, ...env }, dir);

  it(
    'a real provider without API_KEYS, PSP_WEBHOOK_SECRET or PSP_API_KEY: the dev key, webhook secret and provider key are refused',
    async () => {
      const { code, output } = await production({ PSP_BASE_URL: PROVIDER });
      expect(code).toBe(1);
      expect(output).toContain('API_KEYS is required when NODE_ENV=production');
      expect(output).toContain('PSP_WEBHOOK_SECRET is required when NODE_ENV=production');
      expect(output).toContain('PSP_API_KEY is required when NODE_ENV=production');
    },
    TEST_TIMEOUT_MS,
  );

  it(
    'the published dev key, dev webhook secret and dev provider key, given by name, are refused',
    async () => {
      const { code, output } = await production({
        PSP_BASE_URL: PROVIDER,
        API_KEYS: `demo:${DEV_KEY}`,
        PSP_WEBHOOK_SECRET: DEV_WEBHOOK_SECRET,
        PSP_API_KEY: DEV_PSP_KEY,
      });
      expect(code).toBe(1);
      expect(output).toContain('API_KEYS must not use the published dev secret');
      expect(output).toContain('PSP_WEBHOOK_SECRET is required when NODE_ENV=production, and must not be the published dev secret');
      expect(output).toContain('PSP_API_KEY is required when NODE_ENV=production, and must not be the published dev key');
      expect(output).not.toContain(DEV_PSP_KEY);
    },
    TEST_TIMEOUT_MS,
  );

  it(
    'no provider: the in-process sandbox is refused, defaulted or asked for',
    async () => {
      const defaulted = await production({ API_KEYS: STRONG_KEYS, PSP_WEBHOOK_SECRET: STRONG_WEBHOOK_SECRET });
      expect(defaulted.code).toBe(1);
      expect(defaulted.output).toContain('PSP_BASE_URL is required when NODE_ENV=production');
      const asked = await production({ API_KEYS: STRONG_KEYS, PSP_WEBHOOK_SECRET: STRONG_WEBHOOK_SECRET, PSP_SANDBOX: 'in-process' });
      expect(asked.code).toBe(1);
      expect(asked.output).toContain('PSP_SANDBOX must be unset when NODE_ENV=production');
    },
    TEST_TIMEOUT_MS,
  );

  it(
    'hand-typed secrets: a key of one repeated letter, a too-short key, a webhook secret of 16 zero bytes',
    async () => {
      const repeated = await production({
        PSP_BASE_URL: PROVIDER,
        API_KEYS: `shop:${'a'.repeat(32)}`,
        PSP_WEBHOOK_SECRET: STRONG_WEBHOOK_SECRET,
      });
      expect(repeated.code).toBe(1);
      expect(repeated.output).toContain('API_KEYS must hold generated secrets when NODE_ENV=production: shop has');
      expect(repeated.output).not.toContain('a'.repeat(32));
      const short = await production({
        PSP_BASE_URL: PROVIDER,
        API_KEYS: 'shop:k3Y9x2Qw7Lp0Zr5T',
        PSP_WEBHOOK_SECRET: STRONG_WEBHOOK_SECRET,
      });
      expect(short.code).toBe(1);
      expect(short.output).toContain('API_KEYS must hold generated secrets');
      const zeros = await production({
        PSP_BASE_URL: PROVIDER,
        API_KEYS: STRONG_KEYS,
        PSP_WEBHOOK_SECRET: `whsec_${Buffer.alloc(16).toString('base64')}`,
      });
      expect(zeros.code).toBe(1);
      expect(zeros.output).toContain('PSP_WEBHOOK_SECRET must be random bytes when NODE_ENV=production');
      const typedProviderKey = await production({
        PSP_BASE_URL: PROVIDER,
        API_KEYS: STRONG_KEYS,
        PSP_WEBHOOK_SECRET: STRONG_WEBHOOK_SECRET,
        PSP_API_KEY: 'x'.repeat(32),
      });
      expect(typedProviderKey.code).toBe(1);
      expect(typedProviderKey.output).toContain('PSP_API_KEY must be generated when NODE_ENV=production');
      expect(typedProviderKey.output).not.toContain('x'.repeat(32));
    },
    TEST_TIMEOUT_MS,
  );

  it(
    'without NODE_ENV, a real provider refuses the dev key, the dev webhook secret and the dev provider key too',
    async () => {
      const { code, output } = await startOrRefusal({ PSP_BASE_URL: PROVIDER, EMBEDDED_PG_PORT: embeddedPgPort }, dir);
      expect(code).toBe(1);
      expect(output).toContain('API_KEYS is required when PSP_BASE_URL names a real provider');
      expect(output).toContain('PSP_WEBHOOK_SECRET is required when PSP_BASE_URL names a real provider');
      expect(output).toContain('PSP_API_KEY is required when PSP_BASE_URL names a real provider');
    },
    TEST_TIMEOUT_MS,
  );
});

describe('where the service listens, and says it does', () => {
  let database: { url: string; drop(): Promise<void> };
  const services: ServiceProcess[] = [];
  beforeAll(async () => {
    database = await createTestDatabase();
  });
  afterAll(async () => {
    await Promise.all(services.map((s) => s.kill('SIGKILL')));
    await database?.drop();
  });
  const start = async (env: Record<string, string>) => {
    const service = await startServiceProcess({ DATABASE_URL: database.url, API_KEYS: `alice:${ALICE.secret}`, ...env });
    services.push(service);
    return { service, port: Number(new URL(service.url).port) };
  };

  it(
    'development binds loopback only, and the banner says so',
    async () => {
      const { service, port } = await start({});
      expect(boundAddresses(port)).toEqual([LOOPBACK_V4]);
      expect(service.output()).toContain(`listening on http://localhost:${port} (bound to 127.0.0.1: this machine only`);
    },
    TEST_TIMEOUT_MS,
  );

  it(
    'HOST=0.0.0.0 in development, and production by default, bind every interface, and the banner says so',
    async () => {
      const dev = await start({ HOST: '0.0.0.0' });
      expect(boundAddresses(dev.port)).toEqual([ANY_V4]);
      expect(dev.service.output()).toContain('bound to 0.0.0.0: every interface');
      const prod = await start({
        NODE_ENV: 'production',
        API_KEYS: STRONG_KEYS,
        PSP_WEBHOOK_SECRET: STRONG_WEBHOOK_SECRET,
        PSP_API_KEY: STRONG_PSP_KEY,
        PSP_BASE_URL: PROVIDER,
        IDEMPOTENCY_ENCRYPTION_KEYS: `k1:${Buffer.from(Array.from({ length: 32 }, (_, i) => i * 5)).toString('base64')}`,
      });
      expect(boundAddresses(prod.port)).toEqual([ANY_V4]);
      expect(prod.service.output()).toContain('bound to 0.0.0.0: every interface');
      // One PostgreSQL, no standby: production is told a failover would lose acknowledged writes (stderr: waited for).
      expect(prod.service.output()).toContain('commits: acknowledged by the primary alone (no synchronous standby)');
      await until('the production warning', 10_000, () =>
        prod.service.output().includes('WARNING: the primary acknowledges commits alone'),
      );
      expect(dev.service.output()).not.toContain('WARNING: the primary acknowledges commits alone');
    },
    TEST_TIMEOUT_MS,
  );
});
