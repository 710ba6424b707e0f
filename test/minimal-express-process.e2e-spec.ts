/**
 * apps/minimal-express as its own OS process, as `node dist/apps/minimal-express/src/main.js` runs it, with
 * NODE_ENV=production: its handler writes through an injected TypeORM repository. Duplicates in parallel and a
 * `kill -9` while the handler's write is in flight each leave one transfer, checked in the database.
 */
import { randomUUID } from 'node:crypto';
import { resolve } from 'node:path';
import { Client } from 'pg';
import { until } from './support/outage-load';
import { type ServiceProcess, startServiceProcess } from './support/service-process';
import { createTestDatabase, ignoreIdleErrors } from './support/test-app';

const MAIN = resolve(process.cwd(), 'dist/apps/minimal-express/src/main.js');
/** The advisory lock the test holds to stop a handler's INSERT mid-flight (see the trigger below). */
const HOLD_LOCK = 4242;

describe('apps/minimal-express as a process under NODE_ENV=production, on injected repositories', () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let check: Client;
  let holder: Client;
  const apps: ServiceProcess[] = [];

  const start = async () => {
    const app = await startServiceProcess({ DATABASE_URL: database.url, NODE_ENV: 'production' }, { main: MAIN });
    apps.push(app);
    return app;
  };
  const post = (app: ServiceProcess, key: string, body: unknown) =>
    fetch(`${app.url}/transfers`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-client-id': 'acme' },
      body: JSON.stringify(body),
    });
  const transfersTo = async (account: string) =>
    (await check.query<{ n: number }>(`SELECT count(*)::int AS n FROM transfers WHERE to_account = $1`, [account])).rows[0].n;
  const keyRows = async (key: string) =>
    (
      await check.query<{ state: string; response_status: number | null }>(
        `SELECT state, response_status FROM idempotency_keys WHERE key = $1`,
        [key],
      )
    ).rows;

  beforeAll(async () => {
    database = await createTestDatabase({ empty: true });
    check = ignoreIdleErrors(new Client({ connectionString: database.url }));
    holder = ignoreIdleErrors(new Client({ connectionString: database.url }));
    await check.connect();
    await holder.connect();
  });
  afterAll(async () => {
    for (const app of apps) await app.kill('SIGKILL');
    await holder?.end();
    await check?.end();
    await database?.drop();
  });

  it('30 parallel duplicates: one transfer, one recorded answer, 29 byte-identical replays', async () => {
    const app = await start();
    const key = randomUUID();
    const account = `acc-${randomUUID()}`;
    const responses = await Promise.all(Array.from({ length: 30 }, () => post(app, key, { toAccount: account, amountMinor: 500 })));
    const bodies = await Promise.all(responses.map((r) => r.text()));
    expect(responses.map((r) => r.status)).toEqual(Array(30).fill(201));
    expect(new Set(bodies).size).toBe(1);
    expect(responses.filter((r) => r.headers.get('idempotent-replayed') === 'true')).toHaveLength(29);
    expect(await transfersTo(account)).toBe(1);
    expect(await keyRows(key)).toEqual([{ state: 'completed', response_status: 201 }]);
    await app.kill('SIGTERM');
  });

  it('kill -9 while the handler writes: nothing committed, the key free; the retry on a new process makes one transfer', async () => {
    // The fault, from outside the app: a transfer to a `hold-` account waits, inside its INSERT, for a lock the test holds.
    await check.query(`CREATE OR REPLACE FUNCTION hold_transfer() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN PERFORM pg_advisory_xact_lock(${HOLD_LOCK}); RETURN NEW; END $$`);
    await check.query(`CREATE OR REPLACE TRIGGER hold_transfer AFTER INSERT ON transfers FOR EACH ROW
      WHEN (NEW.to_account LIKE 'hold-%') EXECUTE FUNCTION hold_transfer()`);
    const key = randomUUID();
    const account = `hold-${randomUUID()}`;
    const first = await start();
    await holder.query('SELECT pg_advisory_lock($1)', [HOLD_LOCK]);
    const inFlight = post(first, key, { toAccount: account, amountMinor: 900 }).then(
      (res) => res.status,
      () => 'no answer' as const,
    );
    await until('the handler waits inside its INSERT', async () => {
      const waiting = await check.query(`SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND NOT granted`, [HOLD_LOCK]);
      return waiting.rowCount === 1;
    });
    expect(await first.kill('SIGKILL')).toBeNull();
    expect(await inFlight).toBe('no answer');
    await holder.query('SELECT pg_advisory_unlock($1)', [HOLD_LOCK]);
    // Its backend ends once it finds its client gone; until then its transaction still holds the key's lock.
    await until('the killed process has no backend left', async () => {
      const others = await check.query(
        `SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> ALL($1::int[])`,
        [[(check as unknown as { processID: number }).processID, (holder as unknown as { processID: number }).processID]],
      );
      return others.rowCount === 0;
    });
    expect(await transfersTo(account)).toBe(0);
    expect(await keyRows(key)).toEqual([]);

    await check.query(`DROP TRIGGER hold_transfer ON transfers`);
    const second = await start();
    const retried = await post(second, key, { toAccount: account, amountMinor: 900 });
    expect(retried.status).toBe(201);
    expect(retried.headers.get('idempotent-replayed')).toBeNull();
    const again = await post(second, key, { toAccount: account, amountMinor: 900 });
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(await transfersTo(account)).toBe(1);
    expect(await keyRows(key)).toEqual([{ state: 'completed', response_status: 201 }]);
  });
});
