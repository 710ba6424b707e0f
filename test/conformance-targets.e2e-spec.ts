/**
 * The kit against its own targets (conformance/targets/orders-target.ts), each on its own database and as an OS
 * process: the verdicts that matter come out the same every time. key-after-commit records the key apart from (after)
 * the order's commit, forget-on-restart keeps its keys in memory: both crash checks fail each of them 5 times out
 * of 5, never by chance. route-key keys on method + path + key: other-caller-own-effect fails it. The racing check,
 * made to overlap by the hold, passes twice on each (one effect, each duplicate a replay or a 409).
 */
import { resolve } from 'node:path';
import { Pool } from 'pg';
import { type CheckResult } from '../conformance/checks';
import { type Target, resolveTarget, validateConfig } from '../conformance/config';
import { runConformance } from '../conformance/kit';
import { freePort } from '../src/common/free-port';
import { type ServiceProcess, startServiceProcess } from './support/service-process';
import { createTestDatabase, ignoreIdleErrors } from './support/test-app';

const TARGET = resolve(process.cwd(), 'dist/conformance/targets/orders-target.js');
const PROCESS_TEST_TIMEOUT_MS = 240_000;
const order = { currency: 'EUR', items: [{ sku: 'sku-{{unique}}', quantity: 2, unitPriceMinor: 1500 }] };

/** One target design on its own database, started (and restarted by the crash checks) at a fixed port. */
function targetUnderTest(design: 'key-after-commit' | 'route-key' | 'forget-on-restart') {
  const state: { database?: { url: string; drop(): Promise<void> }; db?: Pool; env: Record<string, string>; processes: ServiceProcess[] } =
    { env: {}, processes: [] };
  const start = async () => void state.processes.push(await startServiceProcess(state.env, { main: TARGET }));
  beforeAll(async () => {
    state.database = await createTestDatabase({ empty: true });
    state.db = ignoreIdleErrors(new Pool({ connectionString: state.database.url, max: 1 }));
    state.env = { DATABASE_URL: state.database.url, PORT: String(await freePort()), TARGET_DESIGN: design, CONFORMANCE_HOOKS: '1' };
    await start();
  }, PROCESS_TEST_TIMEOUT_MS);
  afterAll(async () => {
    await Promise.all(state.processes.map((p) => p.kill('SIGKILL')));
    await state.db?.end();
    await state.database?.drop();
  });
  const target = (only?: string[]): Target =>
    resolveTarget(
      validateConfig({
        base: `http://127.0.0.1:${state.env.PORT}`,
        operation: { method: 'POST', path: '/orders', body: order },
        callers: { a: { Authorization: 'Bearer client-a' }, b: { Authorization: 'Bearer client-b' } },
        effects: { list: { path: '/orders', items: 'items' } },
        hold: { headers: { 'Conformance-Hold': '3000' } },
        openapi: '/docs-json',
        only,
      }),
      {
        crash: { keys: 24, retryWindowMs: 30_000, kill: async () => void (await state.processes.at(-1)!.kill('SIGKILL')), start },
        serverError: {
          body: { currency: 'EUR', items: [{ sku: 'sku-5xx', quantity: 1, unitPriceMinor: 4242 }] },
          arm: async () => {
            await state.db!.query(
              `CREATE FUNCTION conformance_fail() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'provoked'; END $$`,
            );
            await state.db!.query(
              'CREATE TRIGGER conformance_fail BEFORE INSERT ON orders FOR EACH ROW WHEN (NEW.total_minor = 4242) EXECUTE FUNCTION conformance_fail()',
            );
          },
          disarm: async () => void (await state.db!.query('DROP TRIGGER conformance_fail ON orders; DROP FUNCTION conformance_fail()')),
        },
      },
    );
  const ordersOf = async (client: string) =>
    (await state.db!.query<{ n: number }>('SELECT count(*)::int AS n FROM orders WHERE client_id = $1', [client])).rows[0].n;
  return { target, ordersOf };
}

const verdicts = (results: CheckResult[]) => Object.fromEntries(results.map((r) => [r.id, r.outcome]));
const CRASH_CHECKS = ['crash-after-effect', 'crash-one-effect'];

/** Both crash checks, 5 runs: each must fail every run, with the key(s) that ran twice and their exchanges. */
async function crashChecksFailFiveTimes(target: (only?: string[]) => Target, ordersOf: (client: string) => Promise<number>) {
  for (let run = 1; run <= 5; run++) {
    const before = await ordersOf('client-a');
    const { results } = await runConformance(target(CRASH_CHECKS));
    expect({ run, verdicts: verdicts(results) }).toEqual({ run, verdicts: { 'crash-after-effect': 'fail', 'crash-one-effect': 'fail' } });
    const [window, oneEffect] = results;
    expect(window.detail).toMatch(
      /^key conformance-\S+: killed inside the window \((its effect counted while held|answered 102 when held)\), restarted, retried: 2 effects from one key — the key is recorded apart from the effect, or the API forgot its keys on restart/,
    );
    // Evidence: the keys named, and what was sent for them and what came back.
    expect(oneEffect.detail).toMatch(/conformance-[0-9a-f-]{36}/);
    expect(oneEffect.evidence.length).toBeGreaterThanOrEqual(2);
    for (const r of results) expect(r.evidence.every((x) => typeof x.sent.headers['Idempotency-Key'] === 'string')).toBe(true);
    // The database agrees: more orders than keys asked for (1 held + 24 across the kill).
    expect(await ordersOf('client-a')).toBeGreaterThan(before + 1 + 24);
  }
}

describe('the kit against a target that records the key after the order commits', () => {
  const { target, ordersOf } = targetUnderTest('key-after-commit');

  it(
    'both crash checks fail it 5 times out of 5: the kill lands in the window on purpose, not by chance',
    () => crashChecksFailFiveTimes(target, ordersOf),
    PROCESS_TEST_TIMEOUT_MS * 2,
  );

  it(
    'every other check passes: the crash checks are what tell it apart',
    async () => {
      const report = await runConformance(target(CHECKS_BUT_CRASHES));
      expect(verdicts(report.results)).toEqual(Object.fromEntries(CHECKS_BUT_CRASHES.map((id) => [id, 'pass'])));
      // Its duplicates in flight are refused with 409 and Retry-After: the separate verdict on that header.
      expect(report.results.find((r) => r.id === 'conflict-retry-after')!.detail).toMatch(/^9× 409, each with Retry-After/);
    },
    PROCESS_TEST_TIMEOUT_MS,
  );

  it('the racing check overlaps on purpose and passes twice: the duplicates arrive while the first is held', async () => {
    for (let run = 1; run <= 2; run++) {
      const [result] = (await runConformance(target(['parallel-one-effect']))).results;
      expect({ run, outcome: result.outcome, detail: result.detail }).toEqual({
        run,
        outcome: 'pass',
        detail: expect.stringMatching(/1 effect\(s\); the others sent while the first was held \(its effect counted while held\)/),
      });
    }
  });
});

const CHECKS_BUT_CRASHES = [
  'missing-key',
  'malformed-key-too-long',
  'malformed-key-empty',
  'malformed-key-commas',
  'malformed-key-two-headers',
  'retry-replays',
  'another-body-422',
  'parallel-one-effect',
  'conflict-retry-after',
  'other-caller-own-effect',
  'reordered-json-replays',
  'validation-error-keeps-key',
  'server-error-not-stored',
  'openapi-expiry',
];

describe('the kit against a target that keys on method + path + key', () => {
  const { target, ordersOf } = targetUnderTest('route-key');

  it(
    'fails other-caller-own-effect and nothing else, the crash checks included',
    async () => {
      const report = await runConformance(target());
      const failed = report.results.filter((r) => r.outcome !== 'pass' && r.outcome !== 'n/a').map((r) => [r.id, r.outcome]);
      expect(failed).toEqual([['other-caller-own-effect', 'fail']]);
      // Its duplicates wait on the key's lock and replay: no 409 to judge.
      expect(verdicts(report.results)['conflict-retry-after']).toBe('n/a');
      expect(report.results.find((r) => r.id === 'other-caller-own-effect')!.detail).toBe("caller b got a replay: caller a's answer");
      // Client b's request made nothing: it was answered with a's order.
      expect(await ordersOf('client-b')).toBe(0);
    },
    PROCESS_TEST_TIMEOUT_MS,
  );

  it('a hold the target does not honour is a broken run naming hold, not a failure of the API', async () => {
    const unheld = { ...target(['crash-after-effect', 'crash-one-effect']), hold: { headers: { 'X-Not-A-Hold': '3000' } } };
    const { results, summary } = await runConformance(unheld);
    expect(verdicts(results)).toEqual({ 'crash-after-effect': 'broken', 'crash-one-effect': 'broken' });
    for (const r of results) expect(r.detail).toMatch(/^hold: the held request .*answered 201/);
    expect(summary).toMatchObject({ fail: 0, broken: 2 });
  });

  it('the racing check passes twice, overlapped by the hold', async () => {
    for (let run = 1; run <= 2; run++) {
      const [result] = (await runConformance(target(['parallel-one-effect']))).results;
      expect({ run, outcome: result.outcome, detail: result.detail }).toEqual({
        run,
        outcome: 'pass',
        detail: expect.stringMatching(/the others sent while the first was held \(answered 102 when held\)/),
      });
    }
  });
});

describe('the kit against a target that keeps its keys in memory (forgets them on restart)', () => {
  const { target, ordersOf } = targetUnderTest('forget-on-restart');

  it('both crash checks fail it 5 times out of 5', () => crashChecksFailFiveTimes(target, ordersOf), PROCESS_TEST_TIMEOUT_MS * 2);
});
