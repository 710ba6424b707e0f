/**
 * npm run bench:create-sql — PostgreSQL's CPU per idempotent create, A against B, in ONE server so the machine's drift
 * (other processes on the cores) falls on both sides alike. Database `a` has the schema as migrated, database `b` the
 * same plus `B_DDL`; each side is one connection sending a create's statements exactly as `Database` does (three
 * pipelined batches: BEGIN + settings, try-lock, find; SAVEPOINT, the order's statement; the key row, COMMIT), and
 * blocks of `BLOCK` creates alternate between the sides. Printed: the backend's CPU per create of each side from
 * `/proc/<pid>/schedstat` (its time on a core, in the kernel too: sends, WAL writes, fsync), the median of B/A
 * over the blocks (the number to read: an A/A run, no variables, shows the noise).
 *
 * Variables: B_DDL (statements for database b, separated by `;;`: DROP INDEX …, ALTER DATABASE b SET …),
 * B_UNNAMED=1 (b sends unnamed statements, as with DATABASE_PREPARED_STATEMENTS=false), B_CLAIM (one statement
 * taking the key's lock and reading it, instead of the two; it must return `locked` and the key's `id`),
 * B_SAVEPOINT=0 (b sends no SAVEPOINT), B_EVENT=0 (b's order statement writes no outbox row), BLOCK (200),
 * BLOCKS (12 per side). The statements are copies of the service's (orders.service.ts, idempotency-keys.service.ts,
 * database.ts): change them with those.
 * Measured with it: docs/postgres-cost-of-a-create.md.
 */
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { DataSource } from 'typeorm';
import { applyMigrations, migrationDataSourceOptions } from '#service-kit';
import { startEmbeddedPostgres } from '#service-kit/embedded-postgres';
import { migrations } from '../migrations/index.js';
import { freePort } from '../src/common/free-port.js';
import { insertOrderStatement } from '../src/orders/orders.service.js';
// The claim's statements as the package sends them, from its source: they are no part of its public entries.
import { FIND_KEY, INSERT_COMPLETED_KEY, TRY_LOCK_KEY } from '../libs/idempotency/src/idempotency-keys.service.js';

const BEGIN =
  'BEGIN; SET LOCAL lock_timeout = 5000; SET LOCAL statement_timeout = 30000; SET LOCAL idle_in_transaction_session_timeout = 60000';

const ITEMS = [
  { sku: 'SKU-1', quantity: 2, unitPriceMinor: 1500 },
  { sku: 'SKU-2', quantity: 1, unitPriceMinor: 1000 },
];
const ADDRESS = '{"city":"Berlin","line1":"Street 1","postalCode":"10115","country":"DE"}';
// About the size of a created order's stored answer.
const RESPONSE_BODY = JSON.stringify({ status: 'created', currency: 'EUR', totalMinor: 4000, items: ITEMS }).padEnd(420, ' ');

interface Side {
  create(): Promise<void>;
  cpuNs(): number;
  end(): Promise<void>;
}

interface SideOptions {
  url: string;
  unnamed: boolean;
  claim?: string;
  savepoint: boolean;
  event: boolean;
}

async function side({ url, unnamed, claim, savepoint, event }: SideOptions): Promise<Side> {
  const INSERT_ORDER = insertOrderStatement(event);
  const client = new pg.Client({ connectionString: url, pipeline: true });
  await client.connect();
  const { rows } = await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
  const pid = rows[0].pid;
  const names = new Map<string, string>();
  const q = (text: string, values?: unknown[]) => {
    if (!values) return client.query(text);
    if (unnamed) return client.query({ text, values });
    if (!names.has(text)) names.set(text, `s${names.size + 1}`);
    return client.query({ name: names.get(text), text, values });
  };
  let seq = 0;
  return {
    async create() {
      const n = seq++;
      const key = ['client-a', `key-${n}`];
      if (claim) {
        const [, found] = await Promise.all([q(BEGIN), q(claim, key)]);
        const row = found.rows[0] as { locked: boolean; id: string | null };
        if (!row.locked || row.id !== null) throw new Error(`B_CLAIM returned ${JSON.stringify(row)} for a new key`);
      } else {
        await Promise.all([q(BEGIN), q(TRY_LOCK_KEY, key), q(FIND_KEY, key)]);
      }
      const order = [
        'client-a',
        `ord_${n}`,
        'EUR',
        4000,
        ADDRESS,
        null,
        ITEMS.map((i) => i.sku),
        ITEMS.map((i) => i.quantity),
        ITEMS.map((i) => i.unitPriceMinor),
        JSON.stringify(ITEMS),
        'a'.repeat(64),
      ];
      await Promise.all([...(savepoint ? [q('SAVEPOINT idempotent_handler')] : []), q(INSERT_ORDER, order)]);
      const headers = { 'content-type': 'application/json' };
      await Promise.all([
        // Not sealed (the two nulls), a new row id, the TTL.
        q(INSERT_COMPLETED_KEY, [...key, 'f'.repeat(64), 'POST', '/orders', 201, headers, RESPONSE_BODY, null, null, randomUUID(), 86_400]),
        q('COMMIT'),
      ]);
    },
    // The first field of schedstat: nanoseconds this backend spent on a core.
    cpuNs: () => Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]),
    end: () => client.end(),
  };
}

const median = (xs: number[]) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)];

async function main(): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'create-sql-ab-'));
  const sides: Side[] = [];
  let server: Awaited<ReturnType<typeof startEmbeddedPostgres>> | undefined;
  try {
    // The server runs as the postgres user when this runs as root: it must be able to enter the folder.
    await chmod(dir, 0o755);
    server = await startEmbeddedPostgres({ dir: join(dir, 'pg'), port: await freePort(), socket: true });
    const base = server.socketUrl ?? server.url;
    // The database is the URL's path (the user is `postgres` too): `…/postgres?host=…` or `…/postgres`.
    const urlOf = (db: string) => base.replace(/\/postgres(\?|$)/, `/${db}$1`);
    const admin = new pg.Client({ connectionString: base });
    await admin.connect();
    try {
      for (const db of ['a', 'b']) {
        await admin.query(`CREATE DATABASE ${db}`);
        const dataSource = new DataSource(migrationDataSourceOptions(urlOf(db), migrations, 'create-sql-ab'));
        await dataSource.initialize();
        await applyMigrations(dataSource).finally(() => dataSource.destroy());
      }
    } finally {
      await admin.end();
    }
    const b = new pg.Client({ connectionString: urlOf('b') });
    await b.connect();
    try {
      for (const sql of (process.env.B_DDL ?? '').split(';;').filter((s) => s.trim())) await b.query(sql);
    } finally {
      await b.end();
    }
    const A = await side({ url: urlOf('a'), unnamed: false, savepoint: true, event: true });
    sides.push(A);
    const B = await side({
      url: urlOf('b'),
      unnamed: process.env.B_UNNAMED === '1',
      claim: process.env.B_CLAIM || undefined,
      savepoint: process.env.B_SAVEPOINT !== '0',
      event: process.env.B_EVENT !== '0',
    });
    sides.push(B);
    // Warm caches, plans and the first pages of every table and index on both sides.
    for (let i = 0; i < 300; i++) {
      await A.create();
      await B.create();
    }
    const block = Number(process.env.BLOCK ?? 200);
    const blocks = Number(process.env.BLOCKS ?? 12);
    const perCreate: [number[], number[]] = [[], []];
    for (let k = 0; k < blocks; k++) {
      // A first in even blocks, B first in odd ones.
      for (const at of k % 2 ? [1, 0] : [0, 1]) {
        const s = [A, B][at];
        const before = s.cpuNs();
        for (let i = 0; i < block; i++) await s.create();
        perCreate[at].push((s.cpuNs() - before) / 1000 / block);
      }
    }
    const [a, bs] = perCreate;
    const round = (xs: number[]) => xs.map((x) => Math.round(x));
    console.log(
      JSON.stringify({
        b: {
          ddl: process.env.B_DDL ?? '',
          unnamed: process.env.B_UNNAMED === '1',
          claim: process.env.B_CLAIM ?? '',
          savepoint: process.env.B_SAVEPOINT !== '0',
          event: process.env.B_EVENT !== '0',
        },
        backendUsPerCreate: { a: Math.round(median(a)), b: Math.round(median(bs)) },
        medianRatioBA: Number(median(a.map((x, i) => bs[i] / x)).toFixed(3)),
        blocks: { a: round(a), b: round(bs) },
      }),
    );
  } finally {
    for (const s of sides) await s.end().catch(() => undefined);
    await server?.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

await main();
