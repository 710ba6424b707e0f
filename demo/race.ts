/**
 * npm run demo:race — the seed articles' naive versions beside ours, on one database, under 50
 * parallel duplicates (and, where the pattern is about crashes, a kill mid-flight).
 *
 * "Ours" is the service's own SQL sent through plain `pg` (the claim INSERT … ON CONFLICT of
 * idempotency-keys.service.ts, the lease of atomic-phases.ts, TRANSITION_ORDER of orders.service.ts,
 * the conditional reservation of refunds.service.ts), not the HTTP service: the demo isolates the
 * statement that decides each race, so both sides differ only in that statement, and a kill can be
 * aimed at the exact moment between two statements. The e2e suites already drive the real service
 * for the same claims.
 *
 * The naive versions live in scratch tables of a `naive` schema this script creates: demo-only, never
 * a migration. Between their read and their write they wait DEMO_GAP_MS in `pg_sleep`, standing in for
 * the network hop real code has there; that makes their races show every round instead of sometimes.
 *
 * DEMO_ROUNDS (5) rounds per pattern. Exits 0 after printing the table; the last line is `RESULT {json}`.
 */
import { randomUUID } from 'node:crypto';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { DataSource, type QueryRunner } from 'typeorm';
import { claimMessageStatement, createProcessedMessagesTable } from '@idempotent-orders/idempotency/messages';
import { freePort } from '../src/common/free-port.js';
import { type EmbeddedServer, startEmbeddedPostgres } from '#service-kit/embedded-postgres';
import { typeormOptions } from '../src/database/typeorm-options.js';
// The service's own statements, not copies: "ours" below is exactly what the service runs.
import { TRANSITION_ORDER } from '../src/orders/orders.service.js';
import { RESERVE_REFUND } from '../src/payments/refunds.service.js';
import { applyMigrations } from '#service-kit';

const PARALLEL = 50;
/** Ours: the marks' table as the layer creates it (createProcessedMessagesTable), in the demo's scratch schema. */
const OURS_MARKS = 'naive.processed_messages';
const ROUNDS = Number(process.env.DEMO_ROUNDS ?? 5);
// A LAN round trip plus a little work: long enough that 50 parallel requests all read before any writes.
const GAP_S = Number(process.env.DEMO_GAP_MS ?? 20) / 1000;
// The naive claim's TTL and the charge that outlives it (a slow provider): the "DEL on timeout, retry" case.
const CLAIM_TTL_S = 0.2;
const SLOW_CHARGE_S = 0.5;
const CLIENT = 'demo-client';
const PAYMENT_MINOR = 1000;
const REFUND_MINOR = 300;

export interface Counts {
  duplicates: number;
  lostUpdates: number;
  doubleCharges: number;
  stuckKeys: number;
}
type Side = 'naive' | 'ours';
type Row = { pattern: string } & Record<Side, Counts>;

const zero = (): Counts => ({ duplicates: 0, lostUpdates: 0, doubleCharges: 0, stuckKeys: 0 });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The naive side's tables: what the seed articles' code writes to, with the constraints that code relies on and no more. */
const NAIVE_SCHEMA = `
  CREATE SCHEMA naive;
  -- The naive consumer's dedupe marks (a cache beside the effect: written after it, in a transaction of its own)
  -- and the effect both consumers write: no unique constraint, so only the dedupe decides how many there are.
  CREATE TABLE naive.consumer_marks (message_id text PRIMARY KEY);
  CREATE TABLE naive.consumer_effects (consumer text NOT NULL, message_id text NOT NULL);
  -- The dedupe table checked before the work; its key is unique, but the order is inserted first.
  CREATE TABLE naive.idempotency_keys (key text PRIMARY KEY, order_id uuid NOT NULL);
  CREATE TABLE naive.orders (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), request_key text NOT NULL, status text NOT NULL DEFAULT 'created');
  CREATE TABLE naive.order_events (order_id uuid NOT NULL, from_status text NOT NULL, to_status text NOT NULL);
  -- The Redis-style claim (SETNX key EX ttl): atomic on its own, committed apart from the work.
  CREATE TABLE naive.claims (key text PRIMARY KEY, expires_at timestamptz NOT NULL);
  CREATE TABLE naive.payments (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), amount_minor bigint NOT NULL, refunded_minor bigint NOT NULL DEFAULT 0);
  CREATE TABLE naive.refunds (payment_id uuid NOT NULL, amount_minor bigint NOT NULL);
  -- The stand-in payment provider both sides call: one row per charge it makes. Like a real PSP it
  -- dedupes by an idempotency key when one is sent (ours sends the payment's outbound key; the naive code none).
  CREATE TABLE naive.provider_charges (id bigserial PRIMARY KEY, request_key text NOT NULL, outbound_key text UNIQUE);
`;

// ---- ours: the service's statements (kept in step with the files named above) ----

/** idempotency-keys.service.ts CLAIM_KEY: claim or find in one statement. */
const CLAIM_KEY = `
  WITH claimed AS (
    INSERT INTO idempotency_keys (client_id, key, fingerprint, request_method, request_path, expires_at)
    VALUES ($1, $2, 'demo', 'POST', '/orders', now() + interval '1 day')
    ON CONFLICT ON CONSTRAINT uq_idempotency_keys_client_key DO NOTHING
    RETURNING id, state, true AS claimed
  )
  SELECT * FROM claimed
  UNION ALL
  SELECT id, state, false AS claimed FROM idempotency_keys WHERE client_id = $1 AND key = $2`;

const RECORD_RESPONSE = `
  UPDATE idempotency_keys SET state = 'completed', response_status = 201, response_body = $2, completed_at = now() WHERE id = $1`;

/** A different order number per request: only the key claim stands between duplicates and a second order. */
const INSERT_ORDER = `
  INSERT INTO orders (client_id, order_number, currency, total_minor) VALUES ($1, $2, 'EUR', 1000)
  ON CONFLICT ON CONSTRAINT uq_orders_client_order_number DO NOTHING RETURNING id`;

/** atomic-phases.ts: a phased handler's key is committed in_progress under a lease, taken over only once the lease ran out. */
const CLAIM_LEASED_KEY = `
  INSERT INTO idempotency_keys (client_id, key, fingerprint, request_method, request_path, expires_at, lease_token, locked_until)
  VALUES ($1, $2, 'demo', 'POST', '/payments', now() + interval '1 day', gen_random_uuid(), clock_timestamp() + make_interval(secs => $3))
  ON CONFLICT ON CONSTRAINT uq_idempotency_keys_client_key DO NOTHING RETURNING id, lease_token`;
const TAKE_OVER_LEASE = `
  UPDATE idempotency_keys SET lease_token = gen_random_uuid(), locked_until = clock_timestamp() + make_interval(secs => $2)
   WHERE client_id = $3 AND key = $1 AND state = 'in_progress' AND (locked_until IS NULL OR locked_until <= clock_timestamp())
  RETURNING id, lease_token`;
const SETTLE_UNDER_LEASE = `
  UPDATE idempotency_keys SET state = 'completed', response_status = 201, response_body = '{}', completed_at = now(), locked_until = NULL, lease_token = NULL
   WHERE id = $1 AND lease_token = $2 AND state = 'in_progress' RETURNING id`;

class Demo {
  constructor(
    private readonly pool: pg.Pool,
    private readonly admin: pg.Pool,
  ) {}

  /** Runs `work` PARALLEL times at once, each on its own connection, as 50 requests of one retry storm would. */
  private async storm<T>(work: (c: pg.PoolClient, i: number) => Promise<T>, n = PARALLEL): Promise<T[]> {
    return Promise.all(
      Array.from({ length: n }, async (_, i) => {
        const client = await this.pool.connect();
        let broken: Error | undefined;
        try {
          return await work(client, i);
        } catch (err) {
          broken = err as Error;
          throw err;
        } finally {
          client.release(broken ?? killedClients.has(client));
        }
      }),
    );
  }

  /** A process dying mid-flight, as its database sees it: the connection drops, nothing after this line runs. */
  private async kill(client: pg.PoolClient): Promise<void> {
    killedClients.add(client);
    client.on('error', () => undefined);
    const [{ pid }] = (await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows;
    await this.admin.query('SELECT pg_terminate_backend($1)', [pid]);
  }

  private async count(sql: string, params: unknown[]): Promise<number> {
    const { rows } = await this.admin.query<{ n: string }>(sql, params);
    return Number(rows[0].n);
  }

  // (1) Check-then-insert dedupe.
  async dedupe(side: Side, round: number): Promise<Counts> {
    const key = `dedupe-${side}-${round}`;
    if (side === 'naive') {
      await this.storm(async (c) => {
        const seen = await c.query('SELECT order_id FROM naive.idempotency_keys WHERE key = $1', [key]);
        if (seen.rowCount) return 'replayed';
        await c.query('SELECT pg_sleep($1)', [GAP_S]);
        const { rows } = await c.query<{ id: string }>('INSERT INTO naive.orders (request_key) VALUES ($1) RETURNING id', [key]);
        // The key's own uniqueness stops the second key row, not the second order before it (the 500 is swallowed here).
        await c.query('INSERT INTO naive.idempotency_keys (key, order_id) VALUES ($1, $2)', [key, rows[0].id]).catch(() => undefined);
        return 'created';
      });
      return { ...zero(), duplicates: (await this.count('SELECT count(*) AS n FROM naive.orders WHERE request_key = $1', [key])) - 1 };
    }
    await this.storm(async (c) => this.createOrderOnce(c, key));
    return { ...zero(), duplicates: (await this.ordersFor(key)) - 1 };
  }

  /** Ours: claim, work and response in one transaction; a loser waits on the claim's unique index and then replays. */
  private async createOrderOnce(c: pg.PoolClient, key: string, die?: () => boolean): Promise<string> {
    await c.query('BEGIN');
    try {
      const { rows } = await c.query<{ id: string; claimed: boolean }>(CLAIM_KEY, [CLIENT, key]);
      const mine = rows.find((r) => r.claimed);
      if (!mine) {
        await c.query('ROLLBACK');
        return 'replayed';
      }
      await c.query(INSERT_ORDER, [CLIENT, `${key}/${randomUUID()}`]);
      await c.query('SELECT pg_sleep($1)', [GAP_S]);
      if (die?.()) {
        await this.kill(c);
        return 'killed';
      }
      await c.query(RECORD_RESPONSE, [mine.id, '{}']);
      await c.query('COMMIT');
      return 'created';
    } catch (err) {
      if (!killedClients.has(c)) await c.query('ROLLBACK').catch(() => undefined);
      throw err;
    }
  }

  private ordersFor(key: string): Promise<number> {
    return this.count(`SELECT count(*) AS n FROM orders WHERE client_id = $1 AND order_number LIKE $2 || '/%'`, [CLIENT, key]);
  }

  /** Lets exactly one worker of a storm die: the first to reach its kill point. */
  private static oneDeath(): () => boolean {
    let dead = false;
    return () => !dead && (dead = true);
  }

  // (2a) Redis-style claim deleted on failure: the process dies mid-flight, so the DEL never runs.
  async killMidFlight(side: Side, round: number): Promise<Counts> {
    const key = `kill-${side}-${round}`;
    const die = Demo.oneDeath();
    if (side === 'naive') {
      const attempt = async (c: pg.PoolClient, mayDie: boolean): Promise<string> => {
        const claim = await c.query(
          `INSERT INTO naive.claims (key, expires_at) VALUES ($1, now() + interval '1 day') ON CONFLICT DO NOTHING`,
          [key],
        );
        if (!claim.rowCount) return 'in progress';
        try {
          await c.query('BEGIN');
          await c.query('INSERT INTO naive.orders (request_key) VALUES ($1)', [key]);
          await c.query('SELECT pg_sleep($1)', [GAP_S]);
          if (mayDie && die()) {
            await this.kill(c);
            return 'killed';
          }
          await c.query(
            'INSERT INTO naive.idempotency_keys (key, order_id) SELECT $1, id FROM naive.orders WHERE request_key = $1 LIMIT 1',
            [key],
          );
          await c.query('COMMIT');
          return 'created';
        } catch (err) {
          // The failure path the seeds write: roll back, DEL the claim so a retry may try again.
          if (!killedClients.has(c)) {
            await c.query('ROLLBACK').catch(() => undefined);
            await c.query('DELETE FROM naive.claims WHERE key = $1', [key]);
          }
          throw err;
        }
      };
      await this.storm((c) => attempt(c, true));
      // Every client retries after the crash: a second storm of the same request.
      await this.storm((c) => attempt(c, false));
      const orders = await this.count('SELECT count(*) AS n FROM naive.orders WHERE request_key = $1', [key]);
      const claimed = await this.count('SELECT count(*) AS n FROM naive.claims WHERE key = $1', [key]);
      return { ...zero(), duplicates: Math.max(0, orders - 1), stuckKeys: orders === 0 && claimed > 0 ? 1 : 0 };
    }
    await this.storm((c) => this.createOrderOnce(c, key, die));
    await this.storm((c) => this.createOrderOnce(c, key));
    const orders = await this.ordersFor(key);
    const completed = await this.count(
      `SELECT count(*) AS n FROM idempotency_keys WHERE client_id = $1 AND key = $2 AND state = 'completed'`,
      [CLIENT, key],
    );
    return { ...zero(), duplicates: Math.max(0, orders - 1), stuckKeys: orders === 0 || completed === 0 ? 1 : 0 };
  }

  /** The provider: makes a charge unless one exists under the same outbound key (ours always sends one; the naive code none). */
  private async charge(c: pg.PoolClient, key: string, outboundKey: string | null): Promise<void> {
    await c.query('SELECT pg_sleep($1)', [SLOW_CHARGE_S]);
    await c.query('INSERT INTO naive.provider_charges (request_key, outbound_key) VALUES ($1, $2) ON CONFLICT (outbound_key) DO NOTHING', [
      key,
      outboundKey,
    ]);
  }

  // (2b) The charge outlives the claim's TTL; the retry DELs the "expired" claim and charges again.
  async timeoutRetry(side: Side, round: number): Promise<Counts> {
    const key = `ttl-${side}-${round}`;
    const retriesAfterTtl = async (work: (c: pg.PoolClient) => Promise<unknown>) => {
      await sleep(CLAIM_TTL_S * 1000 * 1.5);
      await this.storm(work, PARALLEL - 1);
    };
    if (side === 'naive') {
      const attempt = async (c: pg.PoolClient) => {
        await c.query('DELETE FROM naive.claims WHERE key = $1 AND expires_at <= now()', [key]);
        const claim = await c.query(
          `INSERT INTO naive.claims (key, expires_at) VALUES ($1, now() + make_interval(secs => $2)) ON CONFLICT DO NOTHING`,
          [key, CLAIM_TTL_S],
        );
        if (!claim.rowCount) return;
        await this.charge(c, key, null);
        await c.query('DELETE FROM naive.claims WHERE key = $1', [key]);
      };
      await Promise.all([this.storm(attempt, 1), retriesAfterTtl(attempt)]);
    } else {
      // Phase 1 commits the key under a lease and the payment with its outbound key; a retry after the
      // lease takes it over and resumes that payment, so the provider sees the same outbound key twice.
      const attempt = async (c: pg.PoolClient, first: boolean) => {
        const { rows } = await c.query<{ id: string; lease_token: string }>(
          first ? CLAIM_LEASED_KEY : TAKE_OVER_LEASE,
          first ? [CLIENT, key, CLAIM_TTL_S] : [key, CLAIM_TTL_S, CLIENT],
        );
        if (!rows[0]) return;
        await this.charge(c, key, `payment:${key}`);
        await c.query(SETTLE_UNDER_LEASE, [rows[0].id, rows[0].lease_token]);
      };
      await Promise.all([this.storm((c) => attempt(c, true), 1), retriesAfterTtl((c) => attempt(c, false))]);
    }
    const charges = await this.count('SELECT count(*) AS n FROM naive.provider_charges WHERE request_key = $1', [key]);
    return { ...zero(), doubleCharges: charges - 1 };
  }

  // (3) Unconditional status update: half the storm pays, half cancels, all from "created".
  async statusUpdate(side: Side): Promise<Counts> {
    const target = (i: number) => (i % 2 === 0 ? 'paid' : 'cancelled');
    let orderId: string;
    let moved: string[];
    if (side === 'naive') {
      orderId = (await this.admin.query<{ id: string }>(`INSERT INTO naive.orders (request_key) VALUES ('status') RETURNING id`)).rows[0]
        .id;
      moved = await this.storm(async (c, i) => {
        const { rows } = await c.query<{ status: string }>('SELECT status FROM naive.orders WHERE id = $1', [orderId]);
        if (rows[0].status !== 'created') return '';
        await c.query('SELECT pg_sleep($1)', [GAP_S]);
        await c.query('UPDATE naive.orders SET status = $2 WHERE id = $1', [orderId, target(i)]);
        await c.query('INSERT INTO naive.order_events (order_id, from_status, to_status) VALUES ($1, $2, $3)', [
          orderId,
          rows[0].status,
          target(i),
        ]);
        return target(i);
      });
    } else {
      orderId = (
        await this.admin.query<{ id: string }>(
          `INSERT INTO orders (client_id, order_number, currency, total_minor) VALUES ($1, $2, 'EUR', 1000) RETURNING id`,
          [CLIENT, randomUUID()],
        )
      ).rows[0].id;
      moved = await this.storm(async (c, i) => {
        const { rows } = await c.query<{ status: string }>(TRANSITION_ORDER, [orderId, CLIENT, target(i), ['created']]);
        return rows[0]?.status ?? '';
      });
    }
    const schema = side === 'naive' ? 'naive.' : '';
    const final = (await this.admin.query<{ status: string }>(`SELECT status FROM ${schema}orders WHERE id = $1`, [orderId])).rows[0]
      .status;
    const history = await this.count(`SELECT count(*) AS n FROM ${schema}order_events WHERE order_id = $1`, [orderId]);
    const succeeded = moved.filter(Boolean);
    // A lost update: a move the caller was told succeeded, overwritten by another. A second history row: a move recorded twice.
    return { ...zero(), lostUpdates: succeeded.filter((s) => s !== final).length, duplicates: history - 1 };
  }

  // (4) Read-then-write refund check: 50 refunds of 300 against a payment of 1000 (3 fit).
  async refund(side: Side): Promise<Counts> {
    let refunds: number;
    if (side === 'naive') {
      const paymentId = (
        await this.admin.query<{ id: string }>('INSERT INTO naive.payments (amount_minor) VALUES ($1) RETURNING id', [PAYMENT_MINOR])
      ).rows[0].id;
      await this.storm(async (c) => {
        const { rows } = await c.query<{ amount_minor: string; refunded_minor: string }>(
          'SELECT amount_minor, refunded_minor FROM naive.payments WHERE id = $1',
          [paymentId],
        );
        if (Number(rows[0].refunded_minor) + REFUND_MINOR > Number(rows[0].amount_minor)) return;
        await c.query('SELECT pg_sleep($1)', [GAP_S]);
        await c.query('UPDATE naive.payments SET refunded_minor = refunded_minor + $2 WHERE id = $1', [paymentId, REFUND_MINOR]);
        await c.query('INSERT INTO naive.refunds (payment_id, amount_minor) VALUES ($1, $2)', [paymentId, REFUND_MINOR]);
      });
      refunds = await this.count('SELECT count(*) AS n FROM naive.refunds WHERE payment_id = $1', [paymentId]);
    } else {
      const { rows } = await this.admin.query<{ id: string }>(
        `WITH o AS (INSERT INTO orders (client_id, order_number, currency, total_minor, status) VALUES ($1, $2, 'EUR', $3, 'cancelled') RETURNING id)
         INSERT INTO payments (client_id, order_id, amount_minor, currency, source, status, provider_transaction_id, outbound_key)
         SELECT $1, o.id, $3, 'EUR', 'tok_visa', 'succeeded', $2, 'payment:' || $2 FROM o RETURNING id`,
        [CLIENT, randomUUID(), PAYMENT_MINOR],
      );
      const paymentId = rows[0].id;
      await this.storm(async (c) => {
        await c.query('BEGIN');
        try {
          await c.query('SELECT o.status FROM orders o JOIN payments p ON p.order_id = o.id WHERE p.id = $1 FOR UPDATE OF o', [paymentId]);
          await c.query('SELECT pg_sleep($1)', [GAP_S]);
          const reserved = await c.query(RESERVE_REFUND, [paymentId, REFUND_MINOR]);
          if (reserved.rowCount) {
            await c.query(
              `INSERT INTO refunds (client_id, payment_id, amount_minor, outbound_key) VALUES ($1, $2, $3, 'refund:' || gen_random_uuid())`,
              [CLIENT, paymentId, REFUND_MINOR],
            );
          }
          await c.query('COMMIT');
        } catch (err) {
          await c.query('ROLLBACK').catch(() => undefined);
          throw err;
        }
      });
      refunds = await this.count('SELECT count(*) AS n FROM refunds WHERE payment_id = $1', [paymentId]);
    }
    // Each refund past what fits is money paid out twice: counted with the double charges.
    return { ...zero(), doubleCharges: Math.max(0, refunds - Math.floor(PAYMENT_MINOR / REFUND_MINOR)) };
  }

  /**
   * A broker message redelivered to PARALLEL workers at once (the consumer whose channel died is still in its handler
   * when the broker hands the message to the others). Naive: check the mark, act, then mark ("check, then act, then
   * mark"). Ours: @IdempotentMessage's claim, then the effect, in one transaction.
   */
  async consumeRedelivered(side: Side, round: number): Promise<Counts> {
    const messageId = `message-${side}-${round}`;
    await this.storm(async (c) => {
      if (side === 'naive') {
        const seen = await c.query('SELECT 1 FROM naive.consumer_marks WHERE message_id = $1', [messageId]);
        if (seen.rowCount) return;
        await c.query('SELECT pg_sleep($1)', [GAP_S]);
        await c.query(`INSERT INTO naive.consumer_effects VALUES ('naive', $1)`, [messageId]);
        await c.query('INSERT INTO naive.consumer_marks VALUES ($1) ON CONFLICT DO NOTHING', [messageId]);
        return;
      }
      await c.query('BEGIN');
      try {
        const claimed = await c.query(claimMessageStatement(OURS_MARKS), ['demo', messageId]);
        await c.query('SELECT pg_sleep($1)', [GAP_S]);
        if (claimed.rowCount) await c.query(`INSERT INTO naive.consumer_effects VALUES ('ours', $1)`, [messageId]);
        await c.query('COMMIT');
      } catch (err) {
        await c.query('ROLLBACK').catch(() => undefined);
        throw err;
      }
    });
    const effects = await this.count('SELECT count(*) AS n FROM naive.consumer_effects WHERE message_id = $1', [messageId]);
    return { ...zero(), duplicates: Math.max(0, effects - 1) };
  }
}

/** Clients whose backend this demo terminated: released as broken, never rolled back or reused. */
const killedClients = new WeakSet<pg.PoolClient>();

function add(into: Counts, from: Counts): void {
  for (const k of Object.keys(into) as (keyof Counts)[]) into[k] += from[k];
}

function printTable(rows: Row[]): void {
  const cols: [keyof Counts, string][] = [
    ['duplicates', 'duplicates'],
    ['lostUpdates', 'lost updates'],
    ['doubleCharges', 'double charges'],
    ['stuckKeys', 'stuck keys'],
  ];
  const cell = (c: Counts, k: keyof Counts) => `${c[k]}`.padStart(5);
  const width = Math.max(...rows.map((r) => r.pattern.length));
  console.log(`\n${'pattern'.padEnd(width)} | ${cols.map(([, h]) => `${h} (naive / ours)`).join(' | ')}`);
  console.log(`${'-'.repeat(width)}-|-${cols.map(([, h]) => '-'.repeat(h.length + 15)).join('-|-')}`);
  for (const r of rows) {
    console.log(
      `${r.pattern.padEnd(width)} | ${cols.map(([k, h]) => `${cell(r.naive, k)} / ${cell(r.ours, k)}`.padEnd(h.length + 15)).join(' | ')}`,
    );
  }
}

async function main(): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-demo-'));
  // The server runs as the postgres user when we are root: it must be able to enter the folder.
  await chmod(dir, 0o755);
  let server: EmbeddedServer | undefined;
  let dataSource: DataSource | undefined;
  let pool: pg.Pool | undefined;
  let admin: pg.Pool | undefined;
  const stop = async () => {
    await pool?.end().catch(() => undefined);
    await admin?.end().catch(() => undefined);
    if (dataSource?.isInitialized) await dataSource.destroy().catch(() => undefined);
    await server?.stop().catch(() => undefined);
    await rm(dir, { recursive: true, force: true });
  };
  // Interrupted (Ctrl-C, a test's deadline): stop postgres before leaving.
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => void stop().finally(() => process.exit(130)));
  }
  try {
    console.log(`Starting PostgreSQL in ${dir} …`);
    server = await startEmbeddedPostgres({ dir: join(dir, 'pg'), port: await freePort(), fast: true });
    dataSource = new DataSource(typeormOptions(server.url, { lockTimeoutMs: 30_000 }));
    await dataSource.initialize();
    await applyMigrations(dataSource);
    await dataSource.destroy();
    // Bounds every statement: a wait that never ends fails the demo instead of hanging it.
    const options = '-c statement_timeout=60000';
    pool = new pg.Pool({ connectionString: server.url, max: PARALLEL, options });
    admin = new pg.Pool({ connectionString: server.url, max: 4, options });
    // An idle client whose backend went away (a demo kill, the server stopping) reports here instead of crashing the demo.
    pool.on('error', () => undefined);
    admin.on('error', () => undefined);
    await admin.query(NAIVE_SCHEMA);
    const adminPool = admin;
    await createProcessedMessagesTable({ query: (sql: string) => adminPool.query(sql) } as unknown as QueryRunner, OURS_MARKS);

    console.log(
      `${ROUNDS} rounds per pattern, ${PARALLEL} parallel duplicates each. The naive code waits ${GAP_S * 1000} ms (pg_sleep) between its read and its write, ` +
        `as real code has a network hop there; ours runs the service's statements with the same wait where it has one.`,
    );
    const demo = new Demo(pool, admin);
    const patterns: [string, (side: Side, round: number) => Promise<Counts>][] = [
      ['1 check-then-insert dedupe', (s, r) => demo.dedupe(s, r)],
      ['2a claim DEL on failure, kill mid-flight', (s, r) => demo.killMidFlight(s, r)],
      ['2b claim DEL on timeout, retry', (s, r) => demo.timeoutRetry(s, r)],
      ['3 unconditional status update', (s) => demo.statusUpdate(s)],
      ['4 read-then-write refund check', (s) => demo.refund(s)],
      ['5 consumer check-act-mark, redelivered', (s, r) => demo.consumeRedelivered(s, r)],
    ];
    const rows: Row[] = [];
    for (const [pattern, run] of patterns) {
      const row: Row = { pattern, naive: zero(), ours: zero() };
      for (let round = 0; round < ROUNDS; round++) {
        for (const side of ['naive', 'ours'] as const) add(row[side], await run(side, round));
      }
      rows.push(row);
      console.log(`  ${pattern}: done`);
    }
    printTable(rows);
    console.log(
      '\nSummed over all rounds. duplicates: extra orders (1, 2a), extra history rows (3) or effects of one message (5); lost updates: moves reported done but overwritten (3); ' +
        `double charges: extra provider charges (2b) or refunds past the payment's amount (4); stuck keys: keys nobody can complete after the crash (2a).`,
    );
    console.log(`RESULT ${JSON.stringify(rows)}`);
  } finally {
    await stop();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
