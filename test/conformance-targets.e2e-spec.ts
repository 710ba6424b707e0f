/**
 * The kit against its own two targets (conformance/targets/orders-target.ts), each on its own database and as
 * an OS process: the verdicts that matter come out the same every time. key-after-commit records the key after
 * the order's commit: crash-after-effect (the kill inside that window) fails it 5 times out of 5. route-key keys
 * on method + path + key: other-caller-own-effect fails it. The racing check, made to overlap by the hold, passes
 * twice on each (one effect, each duplicate a replay or a 409 with Retry-After).
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
function targetUnderTest(design: 'key-after-commit' | 'route-key') {
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

describe('the kit against a target that records the key after the order commits', () => {
  const { target, ordersOf } = targetUnderTest('key-after-commit');

  it(
    'crash-after-effect kills it inside that window and finds two orders from one key, 5 times out of 5',
    async () => {
      for (let run = 1; run <= 5; run++) {
        const before = await ordersOf('client-a');
        const [result] = (await runConformance(target(['crash-after-effect']))).results;
        expect({ run, outcome: result.outcome }).toEqual({ run, outcome: 'fail' });
        expect(result.detail).toMatch(
          /^killed inside the window \(its effect counted while held\), restarted, retried: 2 effects from one key/,
        );
        // The database agrees: two orders where one was asked for.
        expect(await ordersOf('client-a')).toBe(before + 2);
      }
    },
    PROCESS_TEST_TIMEOUT_MS,
  );

  it(
    'every other check but the chance crash passes: the window check is what tells it apart',
    async () => {
      const report = await runConformance(target(CHECKS_BUT_CRASHES));
      expect(verdicts(report.results)).toEqual(Object.fromEntries(CHECKS_BUT_CRASHES.map((id) => [id, 'pass'])));
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
      const failed = report.results.filter((r) => r.outcome !== 'pass').map((r) => [r.id, r.outcome]);
      expect(failed).toEqual([['other-caller-own-effect', 'fail']]);
      expect(report.results.find((r) => r.id === 'other-caller-own-effect')!.detail).toBe("caller b got a replay: caller a's answer");
      // Client b's request made nothing: it was answered with a's order.
      expect(await ordersOf('client-b')).toBe(0);
    },
    PROCESS_TEST_TIMEOUT_MS,
  );

  it('a hold the target does not honour fails the window check before any kill: it cannot pass without landing in the window', async () => {
    const unheld = { ...target(['crash-after-effect']), hold: { headers: { 'X-Not-A-Hold': '3000' } } };
    const [result] = (await runConformance(unheld)).results;
    expect(result.outcome).toBe('fail');
    // Answered before its order was counted, or counted a moment before its answer (then killed and restarted): either way a failure.
    expect(result.detail).toMatch(
      /^the held request (answered 201 before a 1xx or its effect counted|was answered \(201\) although the API was killed): hold does not make it wait/,
    );
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
