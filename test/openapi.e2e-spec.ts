import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtemp, readFile, realpath, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import createClient from 'openapi-fetch';
import type { components, paths } from './generated/openapi';
import { ALICE, bearer, startTestApp, type TestApp } from './support/test-app';

/**
 * The API document as real clients see it: what the app serves at /docs-json passes two OpenAPI
 * linters nobody here wrote (Redocly's recommended rules, Spectral's spectral:oas) without a single
 * warning, and a client generated from it (openapi-typescript + openapi-fetch) creates and replays
 * an order and reads typed problem members.
 *
 * The generated types are committed (test/generated/openapi.d.ts) so that `npm run typecheck`
 * compiles the typed client below; this file fails when they no longer match what the app serves
 * (`npm run openapi:types` regenerates them).
 */

const GENERATED_TYPES = resolve('test/generated/openapi.d.ts');
const UPDATE_TYPES = process.env.UPDATE_OPENAPI_TYPES === '1';
/** Each CLI takes 1–5 s alone and far more on a loaded CI machine: generous, since a timeout here says nothing about the API. */
const CLI_TIMEOUT_MS = 180_000;

/** The linters and the generator run as their own CLIs, exactly as a person or CI would run them. */
async function runBin(bin: string, args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const script = await realpath(resolve('node_modules/.bin', bin));
  return new Promise((done, fail) => {
    execFile(
      process.execPath,
      [script, ...args],
      // No telemetry and no update check from Redocly: the test must not depend on the network.
      {
        env: { ...process.env, REDOCLY_TELEMETRY: 'off', REDOCLY_SUPPRESS_UPDATE_NOTICE: 'true', NO_COLOR: '1' },
        maxBuffer: 64 * 1024 * 1024,
      },
      (err, stdout, stderr) => {
        if (err && typeof err.code !== 'number') fail(new Error(`${bin} could not be run`, { cause: err }));
        else done({ code: err ? (err.code as number) : 0, stdout, stderr });
      },
    );
  });
}

function parseJson<T>(tool: string, run: { code: number; stdout: string; stderr: string }): T {
  try {
    return JSON.parse(run.stdout) as T;
  } catch {
    throw new Error(`${tool} did not print JSON (exit ${run.code}):\n${run.stdout}\n${run.stderr}`);
  }
}

interface RedoclyReport {
  totals: { errors: number; warnings: number };
  problems: { ruleId: string; severity: string; message: string; location: { pointer: string }[] }[];
}
interface SpectralFinding {
  code: string;
  severity: number;
  message: string;
  path: string[];
}

describe('the OpenAPI document the app serves', () => {
  let t: TestApp;
  let dir: string;
  let documentPath: string;

  beforeAll(async () => {
    t = await startTestApp();
    dir = await mkdtemp(join(tmpdir(), 'openapi-'));
    const res = await fetch(`${t.url}/docs-json`);
    expect(res.status).toBe(200);
    documentPath = join(dir, 'openapi.json');
    await writeFile(documentPath, await res.text());
  });
  afterAll(async () => {
    await t?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it(
    "has no errors and no warnings under Redocly's recommended rules (redocly.yaml)",
    async () => {
      const run = await runBin('redocly', ['lint', '--config', 'redocly.yaml', '--format=json', documentPath]);
      const report = parseJson<RedoclyReport>('redocly', run);
      // The findings themselves, so a failure says what to fix.
      expect(report.problems.map((p) => `${p.severity} ${p.ruleId} at ${p.location[0]?.pointer}: ${p.message}`)).toEqual([]);
      expect(report.totals).toMatchObject({ errors: 0, warnings: 0 });
    },
    CLI_TIMEOUT_MS,
  );

  it(
    "has no findings under Spectral's spectral:oas rules (.spectral.yaml)",
    async () => {
      // Spectral prints a summary after its JSON on stdout: the JSON goes to a file.
      const output = join(dir, 'spectral.json');
      const run = await runBin('spectral', ['lint', '--ruleset', '.spectral.yaml', '--format', 'json', '--output', output, documentPath]);
      const findings = parseJson<SpectralFinding[]>('spectral', { ...run, stdout: await readFile(output, 'utf8').catch(() => '') });
      expect(
        findings.map((f) => `${['error', 'warning', 'info', 'hint'][f.severity]} ${f.code} at ${f.path.join('.')}: ${f.message}`),
      ).toEqual([]);
      expect(run.code).toBe(0);
    },
    CLI_TIMEOUT_MS,
  );

  it("asks for the sandbox provider's own key on every /psp operation, documenting its 401; every other operation is as before", async () => {
    const document = JSON.parse(await readFile(documentPath, 'utf8')) as {
      paths: Record<string, Record<string, { security?: unknown; responses: Record<string, unknown> }>>;
      components: { securitySchemes: Record<string, { type: string; scheme: string }> };
    };
    expect(document.components.securitySchemes.providerKey).toMatchObject({ type: 'http', scheme: 'bearer' });
    const sandbox = Object.entries(document.paths).flatMap(([path, operations]) =>
      path.startsWith('/psp/') ? Object.entries(operations).map(([method, op]) => ({ path, method, op })) : [],
    );
    expect(sandbox).toHaveLength(4);
    for (const { path, method, op } of sandbox) {
      expect({ path, method, security: op.security, has401: '401' in op.responses }).toEqual({
        path,
        method,
        security: [{ providerKey: [] }],
        has401: true,
      });
    }
  });

  it('has no text Swagger UI would swallow as an HTML tag: descriptions are Markdown, so "<version>" outside a code span vanishes', async () => {
    const document: unknown = JSON.parse(await readFile(documentPath, 'utf8'));
    const swallowed: string[] = [];
    const walk = (node: unknown, path: string): void => {
      if (typeof node === 'string') {
        if (/(description|summary)$/.test(path) && /<[A-Za-z/]/.test(node.replace(/`[^`]*`/g, ''))) swallowed.push(`${path}: ${node}`);
      } else if (node && typeof node === 'object') {
        for (const [key, value] of Object.entries(node)) walk(value, `${path}.${key}`);
      }
    };
    walk(document, '');
    expect(swallowed).toEqual([]);
  });

  it(
    'is what the committed client types (test/generated/openapi.d.ts) were generated from',
    async () => {
      const generated = join(dir, 'openapi.d.ts');
      const run = await runBin('openapi-typescript', [documentPath, '--output', generated]);
      expect({ code: run.code, stderr: run.code ? run.stderr : '' }).toEqual({ code: 0, stderr: '' });
      const fresh = await readFile(generated, 'utf8');
      if (UPDATE_TYPES) await writeFile(GENERATED_TYPES, fresh);
      const committed = await readFile(GENERATED_TYPES, 'utf8').catch(() => '');
      if (committed !== fresh) {
        throw new Error(
          'test/generated/openapi.d.ts does not match the API the app serves: run `npm run openapi:types` and commit the result.',
        );
      }
      expect(committed).toContain('export interface paths');
    },
    CLI_TIMEOUT_MS,
  );

  describe('a typed client generated from it', () => {
    const api = () => createClient<paths>({ baseUrl: t.url, headers: { Authorization: bearer(ALICE) } });
    const body: components['schemas']['CreateOrderDto'] = { currency: 'EUR', items: [{ sku: 'SKU-1', quantity: 2, unitPriceMinor: 1999 }] };

    it('creates an order with an Idempotency-Key, and the same request replays it', async () => {
      const key = randomUUID();
      const first = await api().POST('/orders', { params: { header: { 'Idempotency-Key': key } }, body });
      const again = await api().POST('/orders', { params: { header: { 'Idempotency-Key': key } }, body });

      expect(first.response.status).toBe(201);
      expect(first.response.headers.get('Idempotent-Replayed')).toBeNull();
      // Typed: data is an OrderView, so its fields need no casts.
      const order: components['schemas']['OrderView'] | undefined = first.data;
      expect(order).toMatchObject({ status: 'created', currency: 'EUR', totalMinor: 3998, version: 1 });
      expect(first.response.headers.get('Location')).toBe(`/orders/${order?.id}`);

      expect(again.response.status).toBe(201);
      expect(again.response.headers.get('Idempotent-Replayed')).toBe('true');
      expect(again.data).toEqual(first.data);

      const { rows } = await t.db.query('SELECT count(*)::int AS n FROM orders WHERE id = $1', [order?.id]);
      expect(rows[0].n).toBe(1);
    });

    it('reads currentStatus off a stored invalid-transition problem, replayed the same', async () => {
      const created = await api().POST('/orders', { params: { header: { 'Idempotency-Key': randomUUID() } }, body });
      const id = created.data!.id;
      const key = randomUUID();
      const ship = () => api().POST('/orders/{id}/ship', { params: { path: { id }, header: { 'Idempotency-Key': key } } });

      const refused = await ship();
      const replayed = await ship();

      for (const res of [refused, replayed]) {
        expect(res.response.status).toBe(409);
        expect(res.response.headers.get('Content-Type')).toMatch(/^application\/problem\+json/);
        const problem = res.error;
        // The problem types of a response are a union told apart by `type`: narrowing gives the members.
        if (problem?.type !== 'urn:idempotent-orders:problem:invalid-transition')
          throw new Error(`unexpected problem ${JSON.stringify(problem)}`);
        const currentStatus: components['schemas']['OrderView']['status'] = problem.currentStatus;
        const allowed: components['schemas']['OrderView']['status'][] = problem.allowedTransitions;
        expect({ currentStatus, allowed }).toEqual({ currentStatus: 'created', allowed: ['paid', 'cancelled'] });
      }
      expect(refused.response.headers.get('Idempotent-Replayed')).toBeNull();
      expect(replayed.response.headers.get('Idempotent-Replayed')).toBe('true');
      expect(replayed.error).toEqual(refused.error);
    });

    it('reads a typed 422 when the key is reused for another request', async () => {
      const key = randomUUID();
      const first = await api().POST('/orders', { params: { header: { 'Idempotency-Key': key } }, body });
      const other = await api().POST('/orders', {
        params: { header: { 'Idempotency-Key': key } },
        body: { ...body, note: 'another request' },
      });

      expect(first.response.status).toBe(201);
      expect(other.response.status).toBe(422);
      // Compiles only while the 422's problem types include this one.
      if (other.error?.type !== 'urn:idempotent-orders:problem:idempotency-key-reused')
        throw new Error(`unexpected problem ${JSON.stringify(other.error)}`);
      expect(other.error.title).toBe('Idempotency-Key is already used');
    });
  });
});
