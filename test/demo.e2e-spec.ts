/**
 * `npm run demo` run as the README runs it: the exact commands, with no variable the README does not show, against
 * the service's own defaults (the sandbox's webhooks on, the provider's timeouts and the lease as `npm start` has them).
 * `npm run demo` starts its own service; `DEMO_URL=… npm run demo` walks one started as `npm start` starts it.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { Client } from 'pg';
import { freePort } from '../src/common/free-port';

const ROOT = process.cwd();
const DEMO = resolve(ROOT, 'dist/demo/demo.js');
const MAIN = resolve(ROOT, 'dist/src/main.js');
/** `npm run demo` builds first, then walks (tok_lost alone waits ~11 s): a budget on a loaded machine, not a claim. */
const RUN_DEADLINE_MS = 240_000;
const START_DEADLINE_MS = 120_000;

/** Every step title the narration prints, in order. */
const STEPS = [
  'Create an order with an Idempotency-Key',
  'Retry it with the same key and body',
  'Same key, another body',
  '20 identical requests at once, one key',
  'The same order number again, under a new key',
  'Edit with If-Match, then again with the stale ETag',
  'Cancel an order twice',
  'A form submitted twice with one submit token',
  'Pay with tok_visa, then retry the payment',
  'A declined card, then a new key that pays',
  'A duplicate while the first request is still at the provider',
  'A lost response: the provider charged, the answer never came',
  'Cancel the paid order and refund it in two parts',
  'A signed webhook delivered twice',
];

/** Runs `command` in the repository with only PATH (and HOME, for npm) set besides `env`; its exit code and output. */
async function run(command: string, args: string[], env: Record<string, string> = {}): Promise<{ code: number | null; output: string }> {
  const child = spawn(command, args, {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/root', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const timer = setTimeout(() => child.kill('SIGKILL'), RUN_DEADLINE_MS);
  try {
    const [code] = (await once(child, 'exit')) as [number | null];
    return { code, output };
  } finally {
    clearTimeout(timer);
  }
}

function expectEveryStep(output: string): void {
  expect(output).not.toContain('✗');
  for (const [i, title] of STEPS.entries()) expect(output).toContain(`${i + 1}. ${title}`);
  expect(output).toContain(`All ${STEPS.length} steps answered as narrated.`);
  expect(output).not.toContain('\u001b['); // not a terminal: no colour
}

describe('npm run demo, as the README runs it', () => {
  it(
    '`npm run demo`: starts its own service, walks every step, exits 0',
    async () => {
      const { code, output } = await run('npm', ['run', 'demo']);
      expectEveryStep(output);
      expect(output).not.toContain('skipped');
      expect(code).toBe(0);
    },
    RUN_DEADLINE_MS + 10_000,
  );

  describe('`DEMO_URL=… npm run demo` against a service started as `npm start` starts it', () => {
    let dir: string;
    let service: ChildProcess | undefined;
    let url = '';
    let pgPort = 0;

    beforeAll(async () => {
      dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-demo-test-'));
      // Run as root, the embedded server runs as "postgres", which must be able to enter the folder.
      await chmod(dir, 0o755);
      pgPort = await freePort();
      // npm start's defaults, in a folder of its own (its .data/postgres); only what a second instance needs beside
      // a developer's own `npm start`: another HTTP port and another PostgreSQL port.
      const child = spawn(process.execPath, [MAIN], {
        cwd: dir,
        env: { PATH: process.env.PATH ?? '', PORT: '0', EMBEDDED_PG_PORT: String(pgPort) },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      service = child;
      let output = '';
      child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
      child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
      url = await new Promise<string>((resolveUrl, reject) => {
        const timer = setTimeout(() => reject(new Error(`the service did not start in time:\n${output}`)), START_DEADLINE_MS);
        child.stdout.on('data', () => {
          const match = /listening on (http:\/\/localhost:\d+)/.exec(output);
          if (match) {
            clearTimeout(timer);
            resolveUrl(match[1]);
          }
        });
        child.once('exit', (code) => {
          clearTimeout(timer);
          reject(new Error(`the service exited with ${code} before listening:\n${output}`));
        });
      });
    }, START_DEADLINE_MS + 10_000);

    afterAll(async () => {
      if (service && service.exitCode === null && service.signalCode === null) {
        const exited = once(service, 'exit');
        service.kill('SIGTERM');
        await exited;
      }
      await rm(dir, { recursive: true, force: true });
    }, 60_000);

    it(
      'walks every step (the webhook step skipped: its secret is not given), exits 0, and leaves what the narration says',
      async () => {
        const { code, output } = await run('npm', ['run', 'demo'], { DEMO_URL: url });
        expectEveryStep(output);
        expect(output).toContain('skipped: DEMO_WEBHOOK_SECRET is not set');
        expect(code).toBe(0);

        // What the client saw, checked where it was written.
        const db = new Client({ connectionString: `postgres://postgres:postgres@127.0.0.1:${pgPort}/postgres` });
        await db.connect();
        try {
          const orders = await db.query<{ order_number: string; status: string }>(
            `SELECT order_number, status FROM orders WHERE order_number LIKE 'DEMO-%' ORDER BY order_number`,
          );
          expect(orders.rows.map((r) => [r.order_number.replace(/^DEMO-[a-z0-9]+-/, ''), r.status])).toEqual([
            ['1', 'refunded'],
            ['inflight', 'paid'],
            ['lost', 'paid'],
            ['storm', 'cancelled'],
          ]);
          const cancels = await db.query<{ n: number }>(
            `SELECT count(*)::int AS n FROM order_events e JOIN orders o ON o.id = e.order_id WHERE o.order_number LIKE 'DEMO-%-storm' AND e.to_status = 'cancelled'`,
          );
          expect(cancels.rows[0].n).toBe(1);
          // One payment, and one charge at the provider, for each order the duplicates and retries hit.
          const payments = await db.query<{ order_number: string; status: string; charges: number }>(
            `SELECT o.order_number, p.status,
                    (SELECT count(*)::int FROM psp.charges c WHERE c.payment_id = p.id) AS charges
               FROM payments p JOIN orders o ON o.id = p.order_id
              WHERE o.order_number LIKE 'DEMO-%-inflight' OR o.order_number LIKE 'DEMO-%-lost'
              ORDER BY o.order_number`,
          );
          expect(payments.rows.map((r) => [r.order_number.replace(/^DEMO-[a-z0-9]+-/, ''), r.status, r.charges])).toEqual([
            ['inflight', 'succeeded', 1],
            ['lost', 'succeeded', 1],
          ]);
        } finally {
          await db.end();
        }
      },
      RUN_DEADLINE_MS + 10_000,
    );

    it(
      'exits non-zero, naming the step, when an answer is not what the narration says',
      async () => {
        const { code, output } = await run(process.execPath, [DEMO], { DEMO_URL: url, DEMO_API_KEY: 'not-a-key-of-this-service' });
        expect(code).toBe(1);
        expect(output).toContain('✗ step 1: expected 201, got 401');
      },
      RUN_DEADLINE_MS + 10_000,
    );
  });
});
