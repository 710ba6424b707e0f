/**
 * The conformance kit (conformance/) against the built service as an OS process: every check must pass,
 * the crash check included (the test kills and restarts the process), the 5xx check too (a trigger
 * makes one insert fail). Then the two gaps the kit found, asserted directly: a bare key with commas,
 * and PATCH under an Idempotency-Key.
 */
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { Pool } from 'pg';
import request from 'supertest';
import { CHECKS } from '../conformance/checks';
import { ConfigError, parseArgs, resolveTarget, USAGE, validateConfig } from '../conformance/config';
import { runConformance } from '../conformance/kit';
import { describeExchange } from '../conformance/report';
import { freePort } from '../src/common/free-port';
import { type ServiceProcess, startServiceProcess } from './support/service-process';
import { ALICE, BOB, bearer, createTestDatabase, ignoreIdleErrors } from './support/test-app';

/** Starting the service (twice, with the crash check) on a loaded 2-core machine can pass Jest's 60 s default. */
const PROCESS_TEST_TIMEOUT_MS = 180_000;
const FIVE_HUNDRED_NOTE = 'conformance-five-hundred';
const order = (note: string) => ({ currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 2, unitPriceMinor: 1500 }], note });
const CLI = resolve(process.cwd(), 'dist/conformance/cli.js');

/** The kit's CLI as a user runs it (npm test builds dist/ first). */
function cli(
  args: string[],
  options: { cwd?: string; env?: Record<string, string> } = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((done) =>
    execFile(
      process.execPath,
      [CLI, ...args],
      { cwd: options.cwd, env: { PATH: process.env.PATH ?? '', NO_COLOR: '1', ...options.env } },
      (err, stdout, stderr) => done({ code: err ? Number(err.code) : 0, stdout, stderr }),
    ),
  );
}

describe('the conformance kit: its input', () => {
  it('reads flags into a config; refuses a base that is not loopback, and a missing caller', () => {
    const { config, json } = parseArgs([
      '--base',
      'http://127.0.0.1:3000',
      '--method',
      'post',
      '--path',
      '/orders',
      '--body',
      '{"a":1}',
      '--caller-a',
      'Authorization: Bearer x',
      '--caller-a',
      'X-Tenant: t1',
      '--caller-b',
      'Authorization: Bearer y',
      '--json',
    ]);
    expect(json).toBe(true);
    expect(config.operation).toEqual({ method: 'POST', path: '/orders', body: { a: 1 } });
    expect(config.callers).toEqual({ a: { Authorization: 'Bearer x', 'X-Tenant': 't1' }, b: { Authorization: 'Bearer y' } });
    const base = { operation: { method: 'POST', path: '/orders', body: {} }, callers: { a: {}, b: {} } };
    expect(() => validateConfig({ ...base, base: 'http://example.com' })).toThrow(ConfigError);
    expect(() => validateConfig({ ...base, base: 'http://127.0.0.1:1', callers: { a: {} } })).toThrow(/callers\.b/);
  });

  it('refuses an unknown key or a wrong type by its name, at any depth', () => {
    const valid = { base: 'http://127.0.0.1:1', operation: { method: 'POST', path: '/orders', body: {} }, callers: { a: {}, b: {} } };
    expect(() => validateConfig({ ...valid, crsh: { kill: 'x', start: 'y' } })).toThrow(/^unknown key crsh \(known: base, operation, /);
    expect(() => validateConfig({ ...valid, serverEror: {} })).toThrow(/^unknown key serverEror /);
    expect(() => validateConfig({ ...valid, crash: { kill: 'x', start: 'y', retryWindow: 5 } })).toThrow(
      /^unknown key crash\.retryWindow \(known in crash: kill, start, keys, retryWindowMs\)/,
    );
    expect(() => validateConfig({ ...valid, parallel: '10' })).toThrow(/^parallel must be an integer from 2 to 32, got "10"/);
    expect(() => validateConfig({ ...valid, crash: { kill: 'x', start: 'y', keys: 2.5 } })).toThrow(/^crash\.keys must be an integer/);
    expect(() => validateConfig({ ...valid, callers: { a: { Authorization: 1 }, b: {} } })).toThrow(
      /^callers\.a must be an object of header names/,
    );
    expect(() => validateConfig({ ...valid, effects: { list: { items: 'items' } } })).toThrow(/^effects\.list\.path is required/);
    expect(() => validateConfig({ ...valid, hold: {} })).toThrow(/^hold needs headers, a body or an arm command/);
  });

  it('--help lists every flag the parser takes, as a stranger runs it (npx), with no path into this repository', async () => {
    const flags = [...readFileSync(resolve(process.cwd(), 'conformance/config.ts'), 'utf8').matchAll(/'(--[a-z-]+)'/g)].map((m) => m[1]);
    expect(flags.length).toBeGreaterThan(20);
    for (const flag of new Set(flags)) expect({ flag, listed: USAGE.includes(flag) }).toEqual({ flag, listed: true });
    const help = await cli(['--help']);
    expect(help.code).toBe(0);
    expect(help.stdout).toContain('--timeout-ms MS');
    expect(help.stdout).toMatch(/^npx idempotency-key-conformance --base URL/);
    expect(help.stdout).toContain('CHECKS.md');
    expect(help.stdout).not.toMatch(/conformance\/|docs\//);
    expect(help.stdout).toMatch(/3: .*inconclusive/);
    expect(() => parseArgs(['--bse', 'http://127.0.0.1:1'])).toThrow(/^unknown argument --bse \(--help lists the options\)/);
  });

  it('the package carries its check reference: npm pack lists CHECKS.md beside README.md, and the README links it, not docs/', async () => {
    const packed = await new Promise<string>((done, fail) =>
      execFile(
        'npm',
        ['pack', '--dry-run', '--json', '--ignore-scripts', '--loglevel=error'],
        { cwd: resolve(process.cwd(), 'conformance') },
        (err, stdout) => (err ? fail(new Error(err.message)) : done(stdout)),
      ),
    );
    const files = (JSON.parse(packed) as { files: { path: string }[] }[])[0].files.map((f) => f.path);
    expect(files).toEqual(expect.arrayContaining(['README.md', 'CHECKS.md', 'package.json']));
    const readme = readFileSync(resolve(process.cwd(), 'conformance/README.md'), 'utf8');
    expect(readme).toContain('](CHECKS.md');
    const shipped = readme.slice(0, readme.indexOf('## This repository'));
    expect(shipped).not.toMatch(/\]\(\.\.\//);
  });

  it('a run that cannot test exits 2 naming what to fix: a stopped target (base), an unknown --only id', async () => {
    const port = await freePort();
    const args = [
      '--base',
      `http://127.0.0.1:${port}`,
      '--method',
      'POST',
      '--path',
      '/orders',
      '--body',
      '{}',
      '--caller-a',
      'Authorization: Bearer a',
      '--caller-b',
      'Authorization: Bearer b',
    ];
    const stopped = await cli(args);
    expect(stopped).toMatchObject({ code: 2, stdout: '' });
    expect(stopped.stderr).toMatch(
      new RegExp(`conformance: base http://127\\.0\\.0\\.1:${port}/ is not answering \\(ECONNREFUSED\\): start the API, or fix base`),
    );
    expect(stopped.stderr).not.toMatch(/FAIL|\n +at /);
    const unknown = await cli([...args, '--only', 'retry-replays,crash-once']);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/^conformance: unknown check id in only: crash-once \(known: missing-key, /);
    expect(unknown.stderr).not.toMatch(/\n +at /);
  });

  it('the CLI: a config mistake exits 2 naming the key; a relative --config is read from where the user ran (INIT_CWD under npm run)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'conformance-config-'));
    try {
      const config = {
        base: 'http://127.0.0.1:1',
        operation: { method: 'POST', path: '/orders', body: {} },
        callers: { a: {}, b: {} },
        crash: { kill: 'true', start: 'true' },
      };
      writeFileSync(join(dir, 'typo.json'), JSON.stringify({ ...config, crsh: {} }));
      // npm run moves to the package's folder and says where the user was in INIT_CWD.
      const typo = await cli(['--config', 'typo.json'], { cwd: process.cwd(), env: { INIT_CWD: dir } });
      expect(typo).toMatchObject({ code: 2, stdout: '' });
      expect(typo.stderr).toMatch(/^conformance: unknown key crsh \(known: /);
      const missing = await cli(['--config', 'nowhere.json'], { cwd: dir });
      expect(missing.code).toBe(2);
      expect(missing.stderr).toBe(`conformance: --config nowhere.json: cannot read ${join(dir, 'nowhere.json')} (ENOENT)\n`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('the conformance kit against the service', () => {
  let database: { url: string; drop(): Promise<void> };
  let db: Pool;
  let env: Record<string, string>;
  let service: ServiceProcess;
  const services: ServiceProcess[] = [];
  const start = async () => {
    service = await startServiceProcess(env);
    services.push(service);
  };

  beforeAll(async () => {
    database = await createTestDatabase();
    db = ignoreIdleErrors(new Pool({ connectionString: database.url, max: 1 }));
    // A fixed port: the crash check restarts the service at the same base URL.
    // CONFORMANCE_HOOKS: the kit may hold a create after its writes (src/common/conformance-hold.ts), as in CI.
    env = {
      DATABASE_URL: database.url,
      API_KEYS: `alice:${ALICE.secret},bob:${BOB.secret}`,
      PORT: String(await freePort()),
      CONFORMANCE_HOOKS: '1',
    };
    await start();
  }, PROCESS_TEST_TIMEOUT_MS);
  afterAll(async () => {
    await Promise.all(services.map((s) => s.kill('SIGKILL')));
    await db?.end();
    await database?.drop();
  });

  const targetFor = (only?: string[]) =>
    resolveTarget(
      validateConfig({
        base: service.url,
        operation: { method: 'POST', path: '/orders', body: order('conformance {{unique}}') },
        callers: { a: { Authorization: bearer(ALICE) }, b: { Authorization: bearer(BOB) } },
        effects: { list: { path: '/orders?limit=100', items: 'items', next: 'nextCursor', cursorParam: 'cursor' } },
        hold: { headers: { 'Conformance-Hold': '3000' } },
        openapi: '/docs-json',
        only,
      }),
      { crash: { keys: 24, retryWindowMs: 30_000, kill: async () => void (await service.kill('SIGKILL')), start } },
    );

  it(
    'both crash checks, 5 times out of 5: killed while held inside its transaction, the retry makes the one order; keys answered before the kill replay',
    async () => {
      for (let run = 1; run <= 5; run++) {
        const { rows: before } = await db.query(`SELECT count(*)::int AS n FROM orders`);
        const [window, oneEffect] = (await runConformance(targetFor(['crash-after-effect', 'crash-one-effect']))).results;
        expect({ run, outcome: window.outcome, detail: window.detail }).toEqual({
          run,
          outcome: 'pass',
          detail: expect.stringMatching(/^killed inside the window \(answered 102 when held\); the retry 201 /),
        });
        // Decided from what happened: the held keys were open when the process was seen dead, every run.
        expect({ run, outcome: oneEffect.outcome, detail: oneEffect.detail }).toEqual({
          run,
          outcome: 'pass',
          detail: expect.stringMatching(
            /^24 keys: 8 answered before the kill, \d+ open when the process was seen dead \(3 held in the window: answered 102 when held\); .*; 24 effect\(s\)$/,
          ),
        });
        const { rows: after } = await db.query(`SELECT count(*)::int AS n FROM orders`);
        expect(after[0].n - before[0].n).toBe(1 + 24);
      }
    },
    PROCESS_TEST_TIMEOUT_MS * 3,
  );

  it('parallel-one-effect overlaps on purpose (the first held inside its transaction) and passes twice', async () => {
    for (let run = 1; run <= 2; run++) {
      const [result] = (await runConformance(targetFor(['parallel-one-effect']))).results;
      expect({ run, outcome: result.outcome, detail: result.detail }).toEqual({
        run,
        outcome: 'pass',
        detail: expect.stringMatching(/1 effect\(s\); the others sent while the first was held \(answered 102 when held\)$/),
      });
    }
  });

  it(
    'passes every check, the crash and 5xx checks included',
    async () => {
      const config = validateConfig({
        base: service.url,
        operation: { method: 'POST', path: '/orders', body: order('conformance {{unique}}') },
        callers: { a: { Authorization: bearer(ALICE) }, b: { Authorization: bearer(BOB) } },
        effects: { list: { path: '/orders?limit=100', items: 'items', next: 'nextCursor', cursorParam: 'cursor' } },
        hold: { headers: { 'Conformance-Hold': '3000' } },
        openapi: '/docs-json',
      });
      const target = resolveTarget(config, {
        serverError: {
          body: order(FIVE_HUNDRED_NOTE),
          arm: async () => {
            await db.query(
              `CREATE FUNCTION conformance_fail() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'provoked'; END $$`,
            );
            await db.query(
              `CREATE TRIGGER conformance_fail BEFORE INSERT ON orders FOR EACH ROW WHEN (NEW.note = '${FIVE_HUNDRED_NOTE}') EXECUTE FUNCTION conformance_fail()`,
            );
          },
          disarm: async () => void (await db.query('DROP TRIGGER conformance_fail ON orders; DROP FUNCTION conformance_fail()')),
        },
        crash: {
          keys: 24,
          retryWindowMs: 30_000,
          kill: async () => void (await service.kill('SIGKILL')),
          start,
        },
      });
      const report = await runConformance(target);
      // The one n/a: its duplicates wait on the key and replay, so there is no 409 whose Retry-After to judge.
      expect(report.results.find((r) => r.id === 'conflict-retry-after')!.outcome).toBe('n/a');
      const failed = report.results
        .filter((r) => r.outcome !== 'pass' && r.id !== 'conflict-retry-after')
        .map((r) => ({ id: r.id, outcome: r.outcome, detail: r.detail, evidence: r.evidence.flatMap(describeExchange) }));
      expect(failed).toEqual([]);
      expect(report.results.map((r) => r.id)).toEqual(CHECKS.map((c) => c.id));
      // The 5xx check's insert was refused by the trigger, then ran once disarmed: one order with that note.
      const { rows } = await db.query(`SELECT count(*)::int AS n FROM orders WHERE note = $1`, [FIVE_HUNDRED_NOTE]);
      expect(rows[0].n).toBe(1);
    },
    PROCESS_TEST_TIMEOUT_MS,
  );

  it('the CLI: exit 0 and JSON when the checks pass; exit 1 with what was sent and what came back when one fails', async () => {
    const args = [
      '--base',
      service.url,
      '--method',
      'POST',
      '--path',
      '/orders',
      '--body',
      JSON.stringify(order('cli {{unique}}')),
      '--caller-a',
      `Authorization: ${bearer(ALICE)}`,
      '--caller-b',
      `Authorization: ${bearer(BOB)}`,
      '--only',
      'retry-replays,malformed-key-commas',
    ];
    const passing = await cli([...args, '--json']);
    expect(passing.code).toBe(0);
    const report = JSON.parse(passing.stdout);
    expect(report.results.map((r: { id: string; outcome: string }) => [r.id, r.outcome])).toEqual([
      ['malformed-key-commas', 'pass'],
      ['retry-replays', 'pass'],
    ]);
    // A replay marker the service does not send: the kit must fail, and show both exchanges.
    const failing = await cli([...args, '--replay-header', 'X-Not-Sent']);
    expect(failing.code).toBe(1);
    expect(failing.stdout).toMatch(
      /FAIL +retry-replays +the retry: same status and bytes, but no header marks it as a replay \(X-Not-Sent\)/,
    );
    // The caller's credentials are shown by their length only.
    expect(failing.stdout).toMatch(/sent: POST \/orders Authorization: Bearer <23 characters> \| Idempotency-Key: conformance-/);
    expect(failing.stdout).not.toContain(ALICE.secret);
    expect(failing.stdout).toMatch(/got: +201 [^\n]*idempotent-replayed: true/);
    expect(failing.stdout).not.toContain('\x1b[');
  });

  it('refuses a bare key with commas (two headers merged into one), and accepts it quoted', async () => {
    const post = (key: string) =>
      request(service.url)
        .post('/orders')
        .set('Authorization', bearer(ALICE))
        .set('Idempotency-Key', key)
        .send(order(`commas ${key}`));
    const bare = await post('key,with,commas');
    expect(bare.status).toBe(400);
    expect(bare.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(bare.body).toMatchObject({ title: 'Idempotency-Key is malformed', status: 400 });
    const quoted = await post(`"key,with,commas-${randomUUID()}"`);
    expect(quoted.status).toBe(201);
    const { rows } = await db.query(`SELECT count(*)::int AS n FROM orders WHERE note = 'commas key,with,commas'`);
    expect(rows[0].n).toBe(0);
  });

  describe('PATCH /orders/:id under an Idempotency-Key', () => {
    const create = async () => {
      const res = await request(service.url)
        .post('/orders')
        .set('Authorization', bearer(ALICE))
        .set('Idempotency-Key', randomUUID())
        .send(order('to edit'));
      expect(res.status).toBe(201);
      return res.body.id as string;
    };
    const patch = (id: string, body: object, ifMatch: string, key?: string) => {
      const req = request(service.url).patch(`/orders/${id}`).set('Authorization', bearer(ALICE)).set('If-Match', ifMatch);
      if (key !== undefined) void req.set('Idempotency-Key', key);
      return req.send(body);
    };
    const versionOf = async (id: string) => (await db.query(`SELECT version, note FROM orders WHERE id = $1`, [id])).rows[0];

    it('a retry after a lost answer replays the 200 and its ETag, where a retry without the key gets 412', async () => {
      const id = await create();
      const key = randomUUID();
      const first = await patch(id, { note: 'leave at the door' }, '"1"', key);
      expect(first.status).toBe(200);
      expect(first.headers.etag).toBe('"2"');
      expect(first.headers['idempotent-replayed']).toBeUndefined();

      const retried = await patch(id, { note: 'leave at the door' }, '"1"', key);
      expect(retried.status).toBe(200);
      expect(retried.headers.etag).toBe('"2"');
      expect(retried.headers['idempotent-replayed']).toBe('true');
      expect(retried.text).toBe(first.text);
      // The control: the same retry without the key is refused, the order having moved on.
      expect((await patch(id, { note: 'leave at the door' }, '"1"')).status).toBe(412);
      expect(await versionOf(id)).toEqual({ version: 2, note: 'leave at the door' });
    });

    it('the key is bound to the body and to If-Match: either changed is a 422, and nothing is written', async () => {
      const id = await create();
      const key = randomUUID();
      expect((await patch(id, { note: 'first' }, '"1"', key)).status).toBe(200);
      const otherBody = await patch(id, { note: 'second' }, '"1"', key);
      expect(otherBody.status).toBe(422);
      expect(otherBody.body).toMatchObject({ title: 'Idempotency-Key is already used' });
      const otherVersion = await patch(id, { note: 'first' }, '"2"', key);
      expect(otherVersion.status).toBe(422);
      expect(await versionOf(id)).toEqual({ version: 2, note: 'first' });
    });

    it('a 412 does not burn the key: read again, retry with the same key and the fresh If-Match', async () => {
      const id = await create();
      expect((await patch(id, { note: 'someone else' }, '"1"')).status).toBe(200);
      const key = randomUUID();
      const stale = await patch(id, { note: 'mine' }, '"1"', key);
      expect(stale.status).toBe(412);
      expect(stale.headers.etag).toBe('"2"');
      const fresh = await patch(id, { note: 'mine' }, '"2"', key);
      expect(fresh.status).toBe(200);
      expect(fresh.headers['idempotent-replayed']).toBeUndefined();
      expect(fresh.headers.etag).toBe('"3"');
      expect(await versionOf(id)).toEqual({ version: 3, note: 'mine' });
    });
  });
});
