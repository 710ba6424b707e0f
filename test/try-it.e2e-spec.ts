/**
 * The README's "Try it" (scripts/try-it.sh) run as a newcomer runs it: against the built service started as
 * `npm start` starts it, on an embedded PostgreSQL of its own. The script checks every status it promises.
 */
import { execFile } from 'node:child_process';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { freePort } from '../src/common/free-port';
import { type ServiceProcess, startServiceProcess } from './support/service-process';

const SCRIPT = resolve(process.cwd(), 'scripts/try-it.sh');
/** The start, then ~20 s of requests (tok_lost alone waits ~11 s): a budget on a loaded machine, not a claim. */
const TIMEOUT_MS = 180_000;

describe('scripts/try-it.sh (the README\'s "Try it")', () => {
  let dir: string;
  let service: ServiceProcess | undefined;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-try-it-'));
    // The server runs as the postgres user (we are root in CI): it must be able to enter the folder.
    await chmod(dir, 0o755);
  });
  afterAll(async () => {
    await service?.kill('SIGTERM');
    await rm(dir, { recursive: true, force: true });
  });

  it(
    'runs as pasted against a started service: exit 0, every promised status seen',
    async () => {
      // PSP_WEBHOOK_SECRET and PSP_API_KEY unset, as for `npm start`: the embedded run's dev secret, which the script
      // signs with, and its dev provider key, which the script sends to /psp.
      service = await startServiceProcess({
        EMBEDDED_PG_DIR: join(dir, 'pg'),
        EMBEDDED_PG_PORT: String(await freePort()),
        PSP_WEBHOOK_SECRET: '',
        PSP_API_KEY: '',
      });
      const { code, output } = await new Promise<{ code: number; output: string }>((done) => {
        execFile(
          'bash',
          [SCRIPT],
          { env: { PATH: process.env.PATH ?? '', BASE_URL: service!.url }, timeout: TIMEOUT_MS },
          (err, stdout, stderr) => {
            done({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, output: stdout + stderr });
          },
        );
      });
      expect({ code, tail: output.slice(-600) }).toEqual({
        code: 0,
        tail: expect.stringContaining('✓ every answer was the one its comment promises'),
      });
      for (const status of ['← 201', '← 200', '← 422', '← 412', '← 503', '← 409']) expect(output).toContain(status);
      expect(output).toContain('idempotent-replayed: true');
      expect(output).toMatch(/GET \/orders\?limit=2&cursor=\S+/);
      expect(output).toContain('"outcome":"duplicate"');
    },
    TIMEOUT_MS,
  );
});
