/**
 * Swagger UI as a person uses it: Authorize with an API key, "Try it out" on POST /orders with an
 * Idempotency-Key, Execute twice; then pay that order with tok_visa, Execute twice, and find its one charge
 * in the sandbox's ledger once the provider key is authorized too. Runs in Debian's Chromium
 * (`npm run test:browser`; .ci/run installs it), never a downloaded browser. A failing test leaves
 * screenshots (the whole page, and the viewport) in a temp folder named in the error.
 */
import { randomUUID } from 'node:crypto';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type Browser, chromium, type Page } from 'playwright-core';
import { ALICE, PSP_KEY, startTestApp, type TestApp } from '../support/test-app';

const CREATE = '#operations-orders-createOrder';
const GET_ORDER = '#operations-orders-getOrder';
// Swagger UI's id is #operations-<tag>-<operationId>.
const PAY = '#operations-payments-payOrder';
// The sandbox's tag has a slash and parentheses: matched by the id's end.
const PSP_CHARGES = '[id$="-pspListCharges"]';
// On a loaded machine a page load or an Execute can take tens of seconds. Each browser step may wait
// up to STEP_MS (a step that times out throws inside the test, so the screenshot is taken), and a
// whole test up to TEST_MS, more than the steps of one test need even when several are slow.
const STEP_MS = 45_000;
const TEST_MS = 240_000;

describe('Swagger UI', () => {
  let t: TestApp;
  let browser: Browser;
  let page: Page;

  beforeAll(async () => {
    t = await startTestApp();
    browser = await chromium.launch({
      executablePath: process.env.CHROMIUM_PATH ?? '/usr/bin/chromium',
      args: [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-background-networking',
        '--disable-component-update',
        '--no-first-run',
      ],
    });
  });
  beforeEach(async () => {
    page = await browser.newPage({ viewport: { width: 1300, height: 1800 } });
    page.setDefaultTimeout(STEP_MS);
  });
  afterEach(async () => {
    await page?.close();
  });
  afterAll(async () => {
    await browser?.close();
    await t?.close();
  });

  /** Runs `steps`; on failure, saves what the page showed and names the file in the error. */
  async function withScreenshotOnFailure(name: string, steps: () => Promise<void>): Promise<void> {
    try {
      await steps();
    } catch (err) {
      const dir = mkdtempSync(join(tmpdir(), 'swagger-ui-'));
      // The whole page (tall: every operation), and the viewport: what was on screen, near the last click.
      await page.screenshot({ path: join(dir, `${name}.png`), fullPage: true }).catch(() => undefined);
      await page.screenshot({ path: join(dir, `${name}-viewport.png`) }).catch(() => undefined);
      throw new Error(`${(err as Error).message}\nScreenshots of the page: ${dir}`, { cause: err });
    }
  }

  async function openAuthorized(): Promise<void> {
    await page.goto(`${t.url}/docs`);
    await page.click('button.authorize');
    await page.fill('.auth-container input', ALICE.secret);
    await page.click('.auth-btn-wrapper button.authorize');
    await page.click('button.btn-done');
  }

  /** Clicks Execute and waits for the live response (the previous one is cleared first, if any). */
  async function execute(operation: string): Promise<{ status: string; description: string }> {
    if (await page.isVisible(`${operation} button.btn-clear`)) await page.click(`${operation} button.btn-clear`);
    await page.click(`${operation} button.execute`);
    const row = `${operation} .live-responses-table tbody`;
    await page.waitForSelector(`${row} .response-col_status`);
    // On screen, so a failure's viewport screenshot shows the response it is about.
    await page.locator(row).scrollIntoViewIfNeeded();
    return {
      status: ((await page.textContent(`${row} .response-col_status`)) ?? '').trim(),
      description: (await page.textContent(`${row} .response-col_description`)) ?? '',
    };
  }

  const lastStatus = () => page.textContent(`${CREATE} .live-responses-table tbody .response-col_status`);

  it(
    'creates an order from "Try it out" and replays it on a second Execute',
    async () => {
      await withScreenshotOnFailure('create-order', async () => {
        await openAuthorized();

        await page.click(CREATE);
        await page.click(`${CREATE} button.try-out__btn`);
        await page.fill(`${CREATE} tr[data-param-name="Idempotency-Key"] input`, 'swagger-ui-key-1');
        await page.click(`${CREATE} button.execute`);
        await page.waitForSelector(`${CREATE} .live-responses-table .response-col_status`);
        expect((await lastStatus())?.trim()).toBe('201');

        // Clear the previous response, execute again with the same key: the stored response comes back.
        await page.click(`${CREATE} button.btn-clear`);
        await page.click(`${CREATE} button.execute`);
        await page.waitForSelector(`${CREATE} .live-responses-table .response-col_status`);
        expect((await lastStatus())?.trim()).toBe('201');
        expect(await page.textContent(`${CREATE} .live-responses-table tbody .response-col_description`)).toMatch(
          /idempotent-replayed: true/i,
        );

        const { rows } = await t.db.query(`SELECT count(*)::int AS n FROM idempotency_keys WHERE key = 'swagger-ui-key-1'`);
        expect(rows[0].n).toBe(1);
        const orders = await t.db.query(`SELECT count(*)::int AS n FROM orders WHERE client_id = 'alice'`);
        expect(orders.rows[0].n).toBe(1);
      });
    },
    TEST_MS,
  );

  it(
    'pays an order with tok_visa from "Try it out", a second Execute replays it, and the ledger (with the provider key) shows one charge',
    async () => {
      await withScreenshotOnFailure('pay-order', async () => {
        await openAuthorized();

        // The order, from the example body. The first test may have created it already: a new key
        // with the same orderNumber and content answers 200 with the same order.
        await page.click(CREATE);
        await page.click(`${CREATE} button.try-out__btn`);
        await page.fill(`${CREATE} tr[data-param-name="Idempotency-Key"] input`, `swagger-ui-order-${randomUUID()}`);
        const created = await execute(CREATE);
        expect(['200', '201']).toContain(created.status);
        const orderId = /"id":\s*"([0-9a-f-]{36})"/.exec(created.description)?.[1];
        expect(orderId).toBeDefined();

        // A fresh key per run: the header's example value is fixed, and a key is for one operation.
        const payKey = `swagger-ui-pay-${randomUUID()}`;
        await page.click(PAY);
        await page.click(`${PAY} button.try-out__btn`);
        await page.fill(`${PAY} tr[data-param-name="id"] input`, orderId!);
        await page.fill(`${PAY} tr[data-param-name="Idempotency-Key"] input`, payKey);
        await page.fill(`${PAY} .body-param textarea`, JSON.stringify({ source: 'tok_visa' }));

        const paid = await execute(PAY);
        expect(paid.status).toBe('201');
        expect(paid.description).toMatch(/"status":\s*"succeeded"/);
        expect(paid.description).not.toMatch(/idempotent-replayed/i);
        const paymentId = /"id":\s*"([0-9a-f-]{36})"/.exec(paid.description)?.[1];

        // Execute again, same key and body: the stored 201, marked as a replay, the same payment.
        const replayed = await execute(PAY);
        expect(replayed.status).toBe('201');
        expect(replayed.description).toMatch(/idempotent-replayed: true/i);
        expect(/"id":\s*"([0-9a-f-]{36})"/.exec(replayed.description)?.[1]).toBe(paymentId);

        // The database: one payment, succeeded; the order paid; one charge at the provider; one key row.
        const payments = await t.db.query(`SELECT id, status FROM payments WHERE order_id = $1`, [orderId]);
        expect(payments.rows).toEqual([{ id: paymentId, status: 'succeeded' }]);
        const order = await t.db.query(`SELECT status FROM orders WHERE id = $1`, [orderId]);
        expect(order.rows[0].status).toBe('paid');
        const charges = await t.db.query(`SELECT count(*)::int AS n FROM psp.charges WHERE payment_id = $1`, [paymentId]);
        expect(charges.rows[0].n).toBe(1);
        const keys = await t.db.query(`SELECT count(*)::int AS n FROM idempotency_keys WHERE key = $1`, [payKey]);
        expect(keys.rows[0].n).toBe(1);

        // The provider's ledger from "Try it out": refused (401) until the sandbox's own key is authorized beside the API key.
        await page.click(PSP_CHARGES);
        await page.click(`${PSP_CHARGES} button.try-out__btn`);
        await page.fill(`${PSP_CHARGES} tr[data-param-name="paymentId"] input`, paymentId!);
        expect((await execute(PSP_CHARGES)).status).toBe('401');
        await page.click('button.authorize');
        const providerKey = page.locator('.auth-container', { hasText: 'providerKey' });
        await providerKey.locator('input').fill(PSP_KEY);
        await providerKey.locator('button.authorize').click();
        await page.click('button.btn-done');
        const ledger = await execute(PSP_CHARGES);
        expect(ledger.status).toBe('200');
        expect(ledger.description).toContain(`"paymentId": "${paymentId}"`);
      });
    },
    TEST_MS,
  );

  it(
    'shows the ETag as written, the Authorize dialog says where the dev key is, and the create lists Idempotency-Key first',
    async () => {
      await withScreenshotOnFailure('docs-text', async () => {
        await page.goto(`${t.url}/docs`);

        // Response headers render their description as Markdown: "<version>" used to vanish as an HTML tag.
        for (const operation of [CREATE, GET_ORDER]) {
          await page.click(operation);
          const etag = page.locator(`${operation} table.headers tr`, { hasText: 'ETag' }).first();
          await etag.scrollIntoViewIfNeeded();
          expect(await etag.innerText()).toContain('The order version in quotes, e.g. "3": send it back as If-Match to change the order.');
        }
        expect(await page.locator('body').innerText()).not.toContain('If-Match: ""');

        // The create: Idempotency-Key above Submit-Token; its pattern pages are links that lead to the page.
        const headers = await page
          .locator(`${CREATE} tr[data-param-in="header"]`)
          .evaluateAll((rows) => rows.map((row) => row.getAttribute('data-param-name')));
        expect(headers.slice(0, 2)).toEqual(['Idempotency-Key', 'Submit-Token']);
        const link = page.locator(`${CREATE} .opblock-description-wrapper a`, { hasText: 'idempotency-key' });
        expect(await link.getAttribute('href')).toBe('/patterns/idempotency-key.md');
        const linked = await fetch(`${t.url}/patterns/idempotency-key.md`);
        expect(linked.status).toBe(200);
        expect(await linked.text()).toMatch(/^# /);
        // A real example for note, not "string".
        expect(await page.locator(`${GET_ORDER} .responses-wrapper`).innerText()).toContain('"note": "Leave at the door"');

        await page.click('button.authorize');
        const dialog = await page.locator('.auth-container').first().innerText();
        expect(dialog).toContain('uses the dev key and prints it at start-up: dev-secret-change-me');
        expect(dialog).not.toContain('JWT');
      });
    },
    TEST_MS,
  );

  it(
    'runs under its security headers: a CSP it does not break, nosniff, no framing',
    async () => {
      await withScreenshotOnFailure('security-headers', async () => {
        // Chromium reports each blocked script, style, image or request on the console.
        const violations: string[] = [];
        page.on('console', (message) => {
          if (/Content Security Policy/i.test(message.text())) violations.push(message.text());
        });
        page.on('pageerror', (err) => violations.push(err.message));
        const response = await page.goto(`${t.url}/docs`);
        const headers = response!.headers();
        expect(headers['content-security-policy']).toContain("script-src 'self'");
        expect(headers['content-security-policy']).toContain("frame-ancestors 'none'");
        expect(headers['x-content-type-options']).toBe('nosniff');
        expect(headers['x-frame-options']).toBe('DENY');
        await openAuthorized();
        await page.click(GET_ORDER);
        await page.click(`${GET_ORDER} button.try-out__btn`);
        await page.fill(`${GET_ORDER} tr[data-param-name="id"] input`, randomUUID());
        const answer = await execute(GET_ORDER);
        expect(answer.status).toBe('404');
        expect(violations).toEqual([]);
        // The API's own answers carry them too.
        const api = await fetch(`${t.url}/orders`);
        expect(api.headers.get('x-content-type-options')).toBe('nosniff');
        expect(api.headers.get('x-frame-options')).toBe('DENY');
      });
    },
    TEST_MS,
  );
});
