/**
 * The sandbox provider's migrations are its own (apps/psp-sandbox/migrations) and every way a database meets them works:
 * a fresh database with the sandbox in-process, a database migrated by the old layout (when they were in the service's
 * list), the sandbox alone on its own database (`npm run psp`), and a service that mounts it only later. Real processes,
 * as `npm start` and `npm run psp` run them, on real PostgreSQL databases of their own.
 */
import { randomUUID } from 'node:crypto';
import { Client } from 'pg';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { pspSandboxMigrations } from '#psp-sandbox';
import { migrationDataSourceOptions } from '#service-kit';
import { migrations } from '../migrations/index';
import { ALICE, createTestDatabase, PSP_AUTH } from './support/test-app';
import { SANDBOX_MAIN, type ServiceProcess, startServiceProcess } from './support/service-process';

/** The two sandbox migrations that were the service's, then those written since it has a list of its own. */
const MOVED_NAMES = ['PspSandbox1764414500000', 'PspWebhookOutbox1764414800000'];
const SANDBOX_NAMES = [...MOVED_NAMES, 'PspChargesListing1764415700000', 'PspChargeDeployment1764416000000'];
/** migrations/index.ts before the sandbox had a list of its own: the two sandbox migrations among the service's. */
const OLD_LAYOUT = [
  'Orders1764414000000',
  'OrderLifecycle1764414100000',
  'IdempotencyKeys1764414200000',
  'SubmitTokens1764414300000',
  'OrderCreationDigest1764414400000',
  'PspSandbox1764414500000',
  'Payments1764414600000',
  'Webhooks1764414700000',
  'PspWebhookOutbox1764414800000',
  'KeyRowHotUpdates1764414900000',
  'LateLandings1764415000000',
  'UnreachedSweep1764415100000',
  'OrderEventsOutbox1764415500000',
  'StoredAnswerEncryption1764415600000',
];
/** The service's migrations written since the sandbox has a list of its own. */
const SERVICE_NEWER = ['UnrecordedProviderMoney1764415800000', 'DeploymentId1764416100000'];
const timestampOf = (name: string) => Number(name.slice(-13));
/** Both lists today, in the one timestamp order: the old layout, then the migrations of either written since. */
const LAYOUT = [
  ...OLD_LAYOUT,
  ...[...SANDBOX_NAMES.filter((name) => !MOVED_NAMES.includes(name)), ...SERVICE_NEWER].sort((a, b) => timestampOf(a) - timestampOf(b)),
];
const NOT_A_PROVIDER = 'http://127.0.0.1:9/psp';

describe("the sandbox provider's own migrations", () => {
  const databases: { url: string; drop(): Promise<void> }[] = [];
  const processes: ServiceProcess[] = [];

  afterEach(async () => {
    for (const p of processes.splice(0)) await p.kill('SIGKILL');
  });
  afterAll(async () => {
    for (const d of databases) await d.drop();
  });

  async function freshDatabase(): Promise<string> {
    const database = await createTestDatabase({ empty: true });
    databases.push(database);
    return database.url;
  }

  async function query<T>(url: string, sql: string): Promise<T[]> {
    const db = new Client({ connectionString: url });
    await db.connect();
    try {
      return (await db.query(sql)).rows as T[];
    } finally {
      await db.end();
    }
  }
  const applied = async (url: string) => (await query<{ name: string }>(url, 'SELECT name FROM migrations ORDER BY id')).map((r) => r.name);
  const exists = async (url: string, table: string) =>
    (await query<{ t: string | null }>(url, `SELECT to_regclass('${table}')::text AS t`))[0].t !== null;

  /** Starts a process, waits until it listens, then stops it as Ctrl-C would; its start-up output. */
  async function runUntilListening(
    env: Record<string, string>,
    main?: string,
  ): Promise<{ output: string; url: string; process: ServiceProcess }> {
    const started = await startServiceProcess(env, main ? { main } : {});
    processes.push(started);
    return { output: started.output(), url: started.url, process: started };
  }
  const service = (url: string, env: Record<string, string> = {}) =>
    runUntilListening({ DATABASE_URL: url, API_KEYS: `${ALICE.clientId}:${ALICE.secret}`, ...env });
  const sandboxAlone = (url: string) => runUntilListening({ DATABASE_URL: url, PSP_PORT: '0', PSP_WEBHOOK_URL: 'none' }, SANDBOX_MAIN);
  const chargesAnswer = async (base: string) =>
    (await request(base).get(`/psp/charges?orderId=${randomUUID()}`).set('Authorization', PSP_AUTH)).status;

  it("a fresh database with the sandbox in-process: the service's migrations and the sandbox's, in timestamp order", async () => {
    const url = await freshDatabase();
    const { output, url: base } = await service(url);
    expect(output).toContain(`applied ${LAYOUT.join(', ')}`);
    expect(await applied(url)).toEqual(LAYOUT);
    expect(await chargesAnswer(base)).toBe(200);
  });

  it("a database migrated by the old layout: none of those runs again, only the sandbox's newer ones, wherever it is mounted", async () => {
    const url = await freshDatabase();
    const oldList = [...migrations, ...pspSandboxMigrations]
      .filter((m) => OLD_LAYOUT.includes(m.name))
      .sort((a, b) => timestampOf(a.name) - timestampOf(b.name));
    expect(oldList.map((m) => m.name)).toEqual(OLD_LAYOUT);
    const dataSource = new DataSource(migrationDataSourceOptions(url, oldList, 'old-layout'));
    await dataSource.initialize();
    try {
      await dataSource.runMigrations({ transaction: 'each' });
    } finally {
      await dataSource.destroy();
    }
    expect(await applied(url)).toEqual(OLD_LAYOUT);

    const inProcess = await service(url);
    expect(inProcess.output).toContain(`applied ${LAYOUT.slice(OLD_LAYOUT.length).join(', ')}`);
    expect(await applied(url)).toEqual(LAYOUT);
    expect(await chargesAnswer(inProcess.url)).toBe(200);
    await inProcess.process.kill('SIGTERM');

    const alone = await sandboxAlone(url);
    expect(alone.output).toContain('schema up to date');
    expect(await chargesAnswer(alone.url)).toBe(200);
    await alone.process.kill('SIGTERM');

    const onAProvider = await service(url, { PSP_BASE_URL: NOT_A_PROVIDER });
    expect(onAProvider.output).toContain('schema up to date');
    expect(await applied(url)).toEqual(LAYOUT);
  });

  it('the sandbox alone on a database of its own (npm run psp): its own migrations and nothing of the service', async () => {
    const url = await freshDatabase();
    const { output, url: base } = await sandboxAlone(url);
    expect(output).toContain(`applied ${SANDBOX_NAMES.join(', ')}`);
    expect(await applied(url)).toEqual(SANDBOX_NAMES);
    expect(await exists(url, 'public.orders')).toBe(false);
    expect(await exists(url, 'psp.charges')).toBe(true);
    expect(await chargesAnswer(base)).toBe(200);
  });

  it('a service on a real provider gets no psp schema; mounting the sandbox later applies its migrations then, older ones included', async () => {
    const url = await freshDatabase();
    const first = await service(url, { PSP_BASE_URL: NOT_A_PROVIDER });
    expect(first.output).toContain(`applied ${migrations.map((m) => m.name).join(', ')}`);
    expect(await exists(url, 'psp.charges')).toBe(false);
    await first.process.kill('SIGTERM');

    const later = await service(url);
    expect(later.output).toContain(`applied ${SANDBOX_NAMES.join(', ')}`);
    expect((await applied(url)).sort()).toEqual([...LAYOUT].sort());
    expect(await chargesAnswer(later.url)).toBe(200);
  });
});
