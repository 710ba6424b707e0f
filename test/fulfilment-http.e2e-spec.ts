/**
 * The fulfilment consumer's HTTP side (issue 38): on loopback unless HOST says otherwise, and every route but
 * GET /health behind FULFILMENT_API_TOKEN. Built, bound and announced by the functions main.ts calls, from the
 * configuration an environment gives it. The broker consumer is not connected (this suite has no RabbitMQ; test/broker/
 * runs the whole process), so /health answers 503 here: what it shows is that it answers without a token.
 */
import { randomUUID } from 'node:crypto';
import type { NestFastifyApplication } from '@nestjs/platform-fastify';
import { loadFulfilmentConfig } from '../apps/fulfilment/src/config';
import { createFulfilmentApp, fulfilmentBanner, listenFulfilment } from '../apps/fulfilment/src/http-app';
import { migrateFulfilment } from '../apps/fulfilment/src/migrate';
import { FULFILMENT_TOKEN as TOKEN } from './support/service-process';
import { createTestDatabase } from './support/test-app';

const PROBLEM_JSON = 'application/problem+json';

describe('fulfilment HTTP: loopback by default, a token for everything but /health', () => {
  let database: Awaited<ReturnType<typeof createTestDatabase>>;
  const apps: NestFastifyApplication[] = [];

  beforeAll(async () => {
    database = await createTestDatabase({ empty: true });
    await migrateFulfilment(database.url);
  });
  afterAll(async () => {
    await Promise.all(apps.map((app) => app.close()));
    await database?.drop();
  });

  /** As `npm run start:fulfilment` would with `env` (the broker is never reached: nothing here needs it). */
  const start = async (env: Record<string, string>) => {
    const config = loadFulfilmentConfig({
      DATABASE_URL: database.url,
      AMQP_URL: 'amqp://guest:guest@127.0.0.1:5672',
      PORT: '0',
      LOG_LEVEL: 'silent',
      ...env,
    });
    const app = await createFulfilmentApp(config);
    apps.push(app);
    const bound = await listenFulfilment(app, config);
    return { config, bound, url: `http://127.0.0.1:${bound.port}`, banner: fulfilmentBanner(config, bound, []) };
  };

  it('binds 127.0.0.1 when HOST is unset; anonymous or wrong-token requests get 401 problem+json, the token its answer', async () => {
    const { bound, url, banner } = await start({ FULFILMENT_API_TOKEN: TOKEN });
    expect(bound.address).toBe('127.0.0.1');
    expect(banner).toContain(`fulfilment listening on http://localhost:${bound.port} (bound to 127.0.0.1: this machine only`);

    const order = randomUUID();
    for (const [path, authorization] of [
      [`/shipments/${order}`, undefined],
      ['/metrics', undefined],
      ['/shipments/not-a-uuid', undefined],
      [`/shipments/${order}`, 'Bearer wrong-token-0123456789'],
      ['/metrics', `Basic ${Buffer.from(`x:${TOKEN}`).toString('base64')}`],
    ] as const) {
      const res = await fetch(`${url}${path}`, authorization ? { headers: { authorization } } : {});
      expect([path, authorization, res.status]).toEqual([path, authorization, 401]);
      expect(res.headers.get('content-type')).toContain(PROBLEM_JSON);
      expect(res.headers.get('www-authenticate')).toBe('Bearer');
      expect(await res.json()).toMatchObject({ status: 401, title: 'Unauthorized' });
    }

    const headers = { authorization: `Bearer ${TOKEN}` };
    const missing = await fetch(`${url}/shipments/${order}`, { headers });
    expect(missing.status).toBe(404);
    expect(missing.headers.get('content-type')).toContain(PROBLEM_JSON);
    const metrics = await fetch(`${url}/metrics`, { headers });
    expect(metrics.status).toBe(200);
    expect(await metrics.text()).toMatch(/^process_cpu_seconds_total /m);

    const health = await fetch(`${url}/health`);
    expect(health.status).toBe(503);
    expect(await health.json()).toMatchObject({ database: 'up', broker: 'connecting', consumer: 'not consuming' });
  });

  it('without FULFILMENT_API_TOKEN in development: a token of its own for this start, printed in the banner', async () => {
    const { config, url, banner } = await start({});
    expect(config.apiTokenGenerated).toBe(true);
    expect(config.apiToken).toMatch(/^[A-Za-z0-9_-]{32}$/);
    expect(banner).toContain(`Authorization: Bearer ${config.apiToken}`);
    // Not a constant: the next start has another one.
    expect(loadFulfilmentConfig({ DATABASE_URL: database.url, AMQP_URL: 'amqp://127.0.0.1' }).apiToken).not.toBe(config.apiToken);

    expect((await fetch(`${url}/metrics`)).status).toBe(401);
    expect((await fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${config.apiToken}` } })).status).toBe(200);
  });

  it('HOST=0.0.0.0 binds every interface, and the banner says so', async () => {
    const { bound, banner } = await start({ HOST: '0.0.0.0', FULFILMENT_API_TOKEN: TOKEN });
    expect(bound.address).toBe('0.0.0.0');
    expect(banner).toContain('(bound to 0.0.0.0: every interface, reachable from other machines)');
  });
});
