import { randomUUID } from 'node:crypto';
import type { Pool } from 'pg';
import request from 'supertest';
import type { ServiceProcess } from './service-process';
import { ALICE, bearer } from './test-app';

export const PROBLEM_JSON = /^application\/problem\+json/;
/** Far above any answer on a loaded 2-core machine, below the 30 s statement timeout a hang would reach. */
export const ANSWER_DEADLINE_MS = 20_000;
const RECOVERY_DEADLINE_MS = 30_000;
const LOAD_WORKERS = 4;

export async function until(what: string, condition: () => Promise<boolean> | boolean, deadlineMs = RECOVERY_DEADLINE_MS): Promise<void> {
  const deadline = Date.now() + deadlineMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

export interface Outcome {
  key: string;
  phase: 'before' | 'down' | 'after';
  status: number | 'no answer';
  id?: string;
  problem?: { contentType?: string; retryAfter?: string; type?: string };
}

const orderBody = (note: string) => ({ currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 1, unitPriceMinor: 100 }], note });

/** One write of the load under `key`, not yet sent: by default a create of an order whose note is `notePrefix` + key. */
export type LoadWrite = (url: string, key: string) => request.Test;
const createOrder =
  (notePrefix: string): LoadWrite =>
  (url, key) =>
    request(url)
      .post('/orders')
      .set('Authorization', bearer(ALICE))
      .set('Idempotency-Key', key)
      .send(orderBody(`${notePrefix}${key}`));

/**
 * Creates, each under a fresh Idempotency-Key, sent by a few workers in a loop to `url` while a test takes
 * the database (or what stands before it) away and brings it back; every answer is kept with the phase it was
 * sent in. Each order's note is `notePrefix` + its key, so a retried key can be counted in the database.
 * `write`: another write to send instead (the sandbox's charges); its answer's `id` is kept the same way.
 */
export function createsUnderLoad(url: string, notePrefix: string, write: LoadWrite = createOrder(notePrefix)) {
  let phase: Outcome['phase'] = 'before';
  let loading = true;
  const outcomes: Outcome[] = [];
  const create = async (key: string): Promise<Outcome> => {
    const at = phase;
    try {
      const res = await write(url, key).timeout(ANSWER_DEADLINE_MS);
      return {
        key,
        phase: at,
        status: res.status,
        id: res.status === 201 ? (res.body as { id: string }).id : undefined,
        problem:
          res.status >= 400
            ? {
                contentType: res.headers['content-type'],
                retryAfter: res.headers['retry-after'],
                type: (res.body as { type?: string }).type,
              }
            : undefined,
      };
    } catch {
      return { key, phase: at, status: 'no answer' };
    }
  };
  // A bounded loop per worker: it stops when told, or after enough requests that a stuck test still ends.
  const workers = Array.from({ length: LOAD_WORKERS }, async () => {
    for (let i = 0; loading && i < 5_000; i++) outcomes.push(await create(randomUUID()));
  });
  return {
    outcomes,
    create,
    count: (p: Outcome['phase'], status: Outcome['status']) => outcomes.filter((o) => o.phase === p && o.status === status).length,
    enter: (next: Outcome['phase']) => (phase = next),
    stop: async () => {
      loading = false;
      await Promise.all(workers);
    },
  };
}

/** Once the database is back: /health says so, and creates succeed again (the load's later answers count as 'after'). */
export async function expectRecovery(load: ReturnType<typeof createsUnderLoad>, url: string): Promise<void> {
  load.enter('after');
  await until(
    '/health reports the database up',
    async () => (await request(url).get('/health').timeout(ANSWER_DEADLINE_MS)).status === 200,
  );
  await until('creates flow again', () => load.count('after', 201) >= 20);
}

/** The process never died, and never met an unhandled 'error' event. */
export function expectStillServing(svc: ServiceProcess): void {
  expect(svc.child.exitCode).toBeNull();
  expect(svc.output()).not.toMatch(/Unhandled 'error' event|Connection terminated unexpectedly\n\s+at /);
}

/** A create sent while the database cannot be reached: a clean 503 database-unavailable with Retry-After. */
export async function expectRefusedMeanwhile(url: string): Promise<void> {
  const refused = await request(url)
    .post('/orders')
    .set('Authorization', bearer(ALICE))
    .set('Idempotency-Key', randomUUID())
    .timeout(ANSWER_DEADLINE_MS)
    .send(orderBody('during-outage'));
  expect({ status: refused.status, contentType: refused.headers['content-type'] }).toEqual({
    status: 503,
    contentType: expect.stringMatching(PROBLEM_JSON),
  });
  expect(refused.body).toMatchObject({ type: 'urn:idempotent-orders:problem:database-unavailable', status: 503 });
  expect(Number(refused.headers['retry-after'])).toBeGreaterThan(0);
}

/**
 * What every outage must leave: each answer a success or a clean, retryable 503 (no 500, no hang); every
 * create acknowledged with 201 — before, during or after — in the database; and a refused create, retried
 * with its key, running exactly once (or replaying what a cut-off COMMIT did).
 */
export async function expectOnlyCleanRefusals(load: ReturnType<typeof createsUnderLoad>, db: Pool, notePrefix: string): Promise<void> {
  const { outcomes } = load;
  expect([...new Set(outcomes.map((o) => o.status))].sort()).toEqual([201, 503]);
  for (const o of outcomes.filter((x) => x.status === 503)) {
    expect(o.problem).toEqual({
      contentType: expect.stringMatching(PROBLEM_JSON),
      retryAfter: expect.stringMatching(/^\d+$/),
      type: expect.stringMatching(/database-unavailable|overloaded/),
    });
  }
  const acknowledged = outcomes.filter((o) => o.status === 201).map((o) => o.id!);
  const { rows: found } = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM orders WHERE id = ANY($1::uuid[])`, [acknowledged]);
  expect(found[0].n).toBe(acknowledged.length);

  const refusedKeys = outcomes
    .filter((o) => o.status === 503)
    .map((o) => o.key)
    .slice(0, 20);
  for (const key of refusedKeys) expect((await load.create(key)).status).toBe(201);
  const { rows } = await db.query<{ orders: number; keys: number; stuck: number }>(
    `SELECT (SELECT count(*)::int FROM orders WHERE note = ANY($1::text[])) AS orders,
            (SELECT count(DISTINCT note)::int FROM orders WHERE note = ANY($1::text[])) AS keys,
            (SELECT count(*)::int FROM idempotency_keys WHERE state = 'in_progress') AS stuck`,
    [refusedKeys.map((k) => `${notePrefix}${k}`)],
  );
  expect(rows[0]).toEqual({ orders: refusedKeys.length, keys: refusedKeys.length, stuck: 0 });
}
