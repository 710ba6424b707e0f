/**
 * docs/use-it-in-your-app.md as a test: what the page tells a new user to do, done in a temp dir. A Nest CLI scaffold
 * (`nest new`, offline), the layer's packed tarball (`npm pack` of libs/idempotency) installed in it, every
 * ```ts file=… block of the page written where it says, built with the scaffold's own `nest build` and tsconfig,
 * started on a real PostgreSQL. If the page and the code drift apart, this fails where the user would.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { mkdir, mkdtemp, readdir, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { existsSync, realpathSync } from 'node:fs';
import { promisify } from 'node:util';
import { Pool } from 'pg';
import { until } from './support/outage-load';
import { createTestDatabase, ignoreIdleErrors } from './support/test-app';

const run = promisify(execFile);
const REPO = process.cwd();
const NEST = join(REPO, 'node_modules/@nestjs/cli/bin/nest.js');
const PAGE = join(REPO, 'docs/use-it-in-your-app.md');
/** Not installed in the scaffold: the page says it is needed only for metrics. */
const OPTIONAL_PACKAGE = 'prom-client';
const PACKAGE = '@idempotent-orders/idempotency';
/** The repository's own link to the package (an npm workspace): the scaffold gets the packed tarball instead. */
const PACKAGE_SCOPE = '@idempotent-orders';

/** The page's whole files: a fenced block whose info string names where it goes (```ts file=src/app.module.ts). */
function filesOfPage(markdown: string): Map<string, string> {
  const files = new Map<string, string>();
  for (const [, path, body] of markdown.matchAll(/^```ts file=(\S+)\n([\s\S]*?)^```$/gm)) files.set(path, body);
  return files;
}

async function freePort(): Promise<number> {
  const server = createServer().listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as { port: number };
  server.close();
  await once(server, 'close');
  return port;
}

describe('docs/use-it-in-your-app.md, followed literally in a fresh Nest CLI scaffold', () => {
  let workDir: string;
  let app: string;
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  let check: Pool;
  let server: ChildProcess | undefined;
  let output = '';
  let base: string;

  beforeAll(async () => {
    workDir = await mkdtemp(join(tmpdir(), 'use-it-page-'));
    app = join(workDir, 'bookings');
    await run(process.execPath, [NEST, 'new', 'bookings', '--skip-install', '--skip-git', '--package-manager', 'npm'], { cwd: workDir });
    // Offline: the scaffold's dependencies are this repository's (the page's `npm install` list is among them), all but
    // prom-client, which the page says is only for metrics: the app must build and run without it.
    await mkdir(join(app, 'node_modules'));
    for (const entry of await readdir(join(REPO, 'node_modules'))) {
      if (entry !== OPTIONAL_PACKAGE && entry !== PACKAGE_SCOPE) {
        await symlink(join(REPO, 'node_modules', entry), join(app, 'node_modules', entry));
      }
    }
    // The one change the page does not ask for: the scaffold's tests use vitest, which this repository does not install.
    const tsconfigPath = join(app, 'tsconfig.json');
    const tsconfig = JSON.parse(await readFile(tsconfigPath, 'utf8')) as { compilerOptions: { types?: string[] } };
    tsconfig.compilerOptions.types = tsconfig.compilerOptions.types?.filter((t) => !t.startsWith('vitest'));
    await writeFile(tsconfigPath, JSON.stringify(tsconfig, null, 2));
    const page = await readFile(PAGE, 'utf8');
    // "cd libs/idempotency && npm pack", then "npm i <path to>/<tarball>" in the app. Packed without its prepack build:
    // `npm test` has just built libs/idempotency/dist (pretest), and a rebuild would empty it under the repository.
    const { stdout: packed } = await run('npm', ['pack', '--ignore-scripts', '--silent', '--pack-destination', workDir], {
      cwd: join(REPO, 'libs/idempotency'),
    });
    const tarball = packed.trim().split('\n').pop() ?? '';
    expect(page).toContain(`npm i <path to>/${tarball}`);
    // What `npm i <tarball>` does, offline (its peers and its one dependency are among the linked packages above): the
    // tarball unpacked into node_modules, and recorded in package.json.
    const installed = join(app, 'node_modules', PACKAGE);
    await mkdir(installed, { recursive: true });
    await run('tar', ['-xzf', join(workDir, tarball), '-C', installed, '--strip-components=1']);
    const manifestPath = join(app, 'package.json');
    const manifest = JSON.parse(await readFile(manifestPath, 'utf8')) as { dependencies: Record<string, string> };
    manifest.dependencies[PACKAGE] = `file:../${tarball}`;
    await writeFile(manifestPath, JSON.stringify(manifest, null, 2));
    const files = filesOfPage(page);
    expect([...files.keys()]).toEqual(
      expect.arrayContaining(['src/app.module.ts', 'src/main.ts', 'src/migrations/1750000000000-idempotency-keys.ts']),
    );
    for (const [path, body] of files) {
      await mkdir(dirname(join(app, path)), { recursive: true });
      await writeFile(join(app, path), body);
    }
    // `npm run build` of the scaffold: nest build, with its tsconfig.build.json.
    await run(process.execPath, [NEST, 'build'], { cwd: app }).catch((err: { stdout?: string; stderr?: string }) => {
      throw new Error(`nest build failed:\n${err.stdout ?? ''}${err.stderr ?? ''}`);
    });

    database = await createTestDatabase({ empty: true });
    check = ignoreIdleErrors(new Pool({ connectionString: database.url, max: 2 }));
    const port = await freePort();
    base = `http://127.0.0.1:${port}`;
    // `npm run start:prod` of the scaffold.
    server = spawn(process.execPath, [resolve(app, 'dist/main.js')], {
      cwd: app,
      env: { PATH: process.env.PATH ?? '', DATABASE_URL: database.url, PORT: String(port), NODE_ENV: 'production' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    server.stdout?.on('data', (chunk: Buffer) => (output += chunk.toString()));
    server.stderr?.on('data', (chunk: Buffer) => (output += chunk.toString()));
    await until(
      'the scaffold app answers',
      async () => {
        if (server?.exitCode !== null) throw new Error(`the app exited:\n${output}`);
        return fetch(`${base}/bookings`).then(
          () => true,
          () => false,
        );
      },
      60_000,
    );
  });
  afterAll(async () => {
    if (server && server.exitCode === null && server.signalCode === null) {
      const exited = once(server, 'exit');
      server.kill('SIGKILL');
      await exited;
    }
    await check?.end();
    await database?.drop();
    if (workDir) await rm(workDir, { recursive: true, force: true });
  });

  const book = (key: string, body: unknown, user = 'ada') =>
    fetch(`${base}/bookings`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-user-id': user },
      body: JSON.stringify(body),
    });
  const bookingsOf = async (room: string) =>
    (await check.query<{ n: number }>(`SELECT count(*)::int AS n FROM bookings WHERE room = $1`, [room])).rows[0].n;
  const keyRows = async (key: string) =>
    (
      await check.query<{ state: string; response_status: number | null }>(
        `SELECT state, response_status FROM idempotency_keys WHERE key = $1`,
        [key],
      )
    ).rows;

  it("the migration ran at start-up: the layer's table and the app's", async () => {
    const tables = await check.query<{ t: string }>(`SELECT tablename AS t FROM pg_tables WHERE schemaname = 'public' ORDER BY 1`);
    expect(tables.rows.map((r) => r.t)).toEqual(expect.arrayContaining(['bookings', 'idempotency_keys']));
  });

  it('20 parallel duplicates on the injected repository: one booking, 19 byte-identical replays', async () => {
    const key = randomUUID();
    const room = `r-${randomUUID().slice(0, 8)}`;
    const responses = await Promise.all(Array.from({ length: 20 }, () => book(key, { room, nights: 2 })));
    const bodies = await Promise.all(responses.map((r) => r.text()));
    expect(responses.map((r) => r.status)).toEqual(Array(20).fill(201));
    expect(new Set(bodies).size).toBe(1);
    expect(responses.filter((r) => r.headers.get('idempotent-replayed') === 'true')).toHaveLength(19);
    expect(await bookingsOf(room)).toBe(1);
    expect(await keyRows(key)).toEqual([{ state: 'completed', response_status: 201 }]);
  });

  it("a validation error: problem+json with class-validator's messages, nothing stored, the key free", async () => {
    const key = randomUUID();
    const room = `r-${randomUUID().slice(0, 8)}`;
    const res = await book(key, { room, nights: 0 });
    expect(res.status).toBe(400);
    expect(res.headers.get('content-type')).toMatch(/^application\/problem\+json/);
    expect(await res.json()).toMatchObject({
      status: 400,
      errors: ['nights must not be less than 1'],
      detail: 'nights must not be less than 1',
    });
    expect(await keyRows(key)).toEqual([]);
    expect(await bookingsOf(room)).toBe(0);
  });

  it('a business refusal: stored, and replayed byte for byte', async () => {
    const key = randomUUID();
    const room = `r-${randomUUID().slice(0, 8)}`;
    const first = await book(key, { room, nights: 30 });
    const firstBody = await first.text();
    expect(first.status).toBe(422);
    expect(first.headers.get('content-type')).toMatch(/^application\/problem\+json/);
    expect(JSON.parse(firstBody)).toMatchObject({ status: 422, detail: 'A stay may not exceed 14 nights.' });
    const replay = await book(key, { room, nights: 30 });
    expect(replay.status).toBe(422);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(await replay.text()).toBe(firstBody);
    expect(await keyRows(key)).toEqual([{ state: 'completed', response_status: 422 }]);
    expect(await bookingsOf(room)).toBe(0);
  });

  it('the app runs the packed package: unpacked in its node_modules, no link into the repository, no sources', async () => {
    const installed = realpathSync(join(app, 'node_modules', PACKAGE));
    expect(installed.startsWith(REPO)).toBe(false);
    expect(existsSync(join(installed, 'src'))).toBe(false);
    const { stdout } = await run(
      process.execPath,
      ['--input-type=module', '-e', `console.log(import.meta.resolve('${PACKAGE}/messages'))`],
      {
        cwd: app,
      },
    );
    expect(stdout.trim()).toBe(`file://${join(installed, 'dist/messages.js')}`);
  });

  it('the first screen of the page says what the layer attaches to the DataSource it is given', async () => {
    const firstScreen = (await readFile(PAGE, 'utf8')).split('\n## ')[0];
    expect(firstScreen).toMatch(/replaces `createQueryRunner` on the\s+DataSource/);
  });

  it('prom-client was not there to load', async () => {
    await expect(run(process.execPath, ['-e', "import('prom-client')"], { cwd: app })).rejects.toThrow(/Cannot find package 'prom-client'/);
  });

  it("the layer's log lines are plain text under Nest's default logger", () => {
    expect(output).toMatch(/\[Idempotency\] .*idempotency executed: client ada, key /);
    expect(output).not.toMatch(/Object\(\d+\)/);
  });
});
