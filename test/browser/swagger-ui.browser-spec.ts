/**
 * Swagger UI as a person uses it: Authorize with an API key, "Try it out" on POST /orders with an
 * Idempotency-Key, Execute twice. Runs in Debian's Chromium (`npm run test:browser`; .ci/run
 * installs it), never a downloaded browser.
 */
import { type Browser, chromium, type Page } from 'playwright-core';
import { ALICE, startTestApp, type TestApp } from '../support/test-app';

const CREATE = '#operations-orders-createOrder';

describe('Swagger UI', () => {
  let t: TestApp;
  let browser: Browser;
  let page: Page;

  beforeAll(async () => {
    t = await startTestApp();
    browser = await chromium.launch({
      executablePath: process.env.CHROMIUM_PATH ?? '/usr/bin/chromium',
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--no-first-run'],
    });
    page = await browser.newPage({ viewport: { width: 1300, height: 1800 } });
  });
  afterAll(async () => {
    await browser?.close();
    await t?.close();
  });

  const lastStatus = () => page.textContent(`${CREATE} .live-responses-table tbody .response-col_status`);

  it('creates an order from "Try it out" and replays it on a second Execute', async () => {
    await page.goto(`${t.url}/docs`);
    await page.click('button.authorize');
    await page.fill('.auth-container input', ALICE.secret);
    await page.click('.auth-btn-wrapper button.authorize');
    await page.click('button.btn-done');

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
    expect(await page.textContent(`${CREATE} .live-responses-table tbody .response-col_description`)).toMatch(/idempotent-replayed: true/i);

    const { rows } = await t.db.query(`SELECT count(*)::int AS n FROM idempotency_keys WHERE key = 'swagger-ui-key-1'`);
    expect(rows[0].n).toBe(1);
    const orders = await t.db.query(`SELECT count(*)::int AS n FROM orders WHERE client_id = 'alice'`);
    expect(orders.rows[0].n).toBe(1);
  });
});
