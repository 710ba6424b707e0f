import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { resolve } from 'node:path';
import { ALICE, startTestApp, WEBHOOK_SECRET, type TestApp } from './support/test-app';

const DEMO = resolve(process.cwd(), 'dist/demo/demo.js');
/** The demo's own requests are bounded; this bounds the whole run on a loaded machine. */
const RUN_DEADLINE_MS = 150_000;

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
  'A lost response: the provider charged, the answer never came',
  'Cancel the paid order and refund it in two parts',
  'A signed webhook delivered twice',
];

/** Runs the built demo (`npm test` builds first) against `url`; resolves with its exit code and output. */
async function runDemo(env: Record<string, string>): Promise<{ code: number | null; output: string }> {
  const child = spawn(process.execPath, [DEMO], {
    env: { PATH: process.env.PATH ?? '', NO_COLOR: '1', ...env },
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

describe('npm run demo: the narrated walk, as a smoke test of a running service', () => {
  let t: TestApp;

  beforeAll(async () => {
    t = await startTestApp({
      // As the demo sets them on the service it starts: tok_lost's unknown outcome decided in about a second.
      PSP_TIMEOUT_MS: '300',
      PSP_MAX_ATTEMPTS: '3',
      IDEMPOTENCY_LEASE_SECONDS: '5',
      // Nothing but the demo's requests settles anything (no reconciler, no sandbox webhooks).
      RECONCILE_INTERVAL_MS: '0',
      PSP_WEBHOOK_URL: 'none',
    });
  });
  afterAll(async () => {
    await t?.close();
  });

  it(
    'walks every step against DEMO_URL, exits 0, and leaves exactly what the narration says in the database',
    async () => {
      const { code, output } = await runDemo({ DEMO_URL: t.url, DEMO_API_KEY: ALICE.secret, DEMO_WEBHOOK_SECRET: WEBHOOK_SECRET });
      expect(output).not.toContain('✗');
      expect(code).toBe(0);
      for (const [i, title] of STEPS.entries()) expect(output).toContain(`${i + 1}. ${title}`);
      expect(output).toContain(`All ${STEPS.length} steps answered as narrated.`);
      expect(output).not.toContain('skipped');
      expect(output).not.toContain('\u001b['); // NO_COLOR, and not a terminal

      // What the client saw, checked where it was written.
      const orders = await t.db.query(
        `SELECT order_number, status FROM orders WHERE client_id = 'alice' AND order_number LIKE 'DEMO-%' ORDER BY order_number`,
      );
      expect(orders.rows.map((r) => r.order_number.replace(/^DEMO-[a-z0-9]+-/, ''))).toEqual(['1', 'lost', 'storm']);
      expect(orders.rows.map((r) => r.status)).toEqual(['refunded', 'paid', 'cancelled']);
      const cancels = await t.db.query(
        `SELECT count(*)::int AS n FROM order_events e JOIN orders o ON o.id = e.order_id WHERE o.order_number LIKE 'DEMO-%-storm' AND e.to_status = 'cancelled'`,
      );
      expect(cancels.rows[0].n).toBe(1);
      const lost = await t.db.query(
        `SELECT p.status FROM payments p JOIN orders o ON o.id = p.order_id WHERE o.order_number LIKE 'DEMO-%-lost'`,
      );
      expect(lost.rows).toEqual([{ status: 'succeeded' }]);
    },
    RUN_DEADLINE_MS + 10_000,
  );

  it(
    'exits non-zero, naming the step, when an answer is not what the narration says',
    async () => {
      const { code, output } = await runDemo({ DEMO_URL: t.url, DEMO_API_KEY: 'not-a-key-of-this-service' });
      expect(code).toBe(1);
      expect(output).toContain('✗ step 1: expected 201, got 401');
    },
    RUN_DEADLINE_MS + 10_000,
  );

  it(
    'skips the webhook step, saying why, when DEMO_URL is given without DEMO_WEBHOOK_SECRET',
    async () => {
      const { code, output } = await runDemo({ DEMO_URL: t.url, DEMO_API_KEY: ALICE.secret });
      expect(code).toBe(0);
      expect(output).toContain('skipped: DEMO_WEBHOOK_SECRET is not set');
    },
    RUN_DEADLINE_MS + 10_000,
  );
});
