/**
 * What `docker compose up` publishes (issue 38): parsed from docker-compose.yml and deploy/nginx.conf as shipped.
 * Only the load balancer has a host port; it forwards the API and Swagger UI, never the sandbox provider (/psp) or
 * /metrics; the api runs no in-process sandbox (the image's NODE_ENV=production would refuse it anyway); fulfilment's
 * /shipments and /metrics need a token compose has no default for.
 */
import { readFileSync } from 'node:fs';
import { load } from 'js-yaml';

interface Service {
  ports?: string[];
  environment?: Record<string, string>;
  command?: string[];
}
const compose = load(readFileSync('docker-compose.yml', 'utf8')) as { services: Record<string, Service> };
const nginx = readFileSync('deploy/nginx.conf', 'utf8');

/** The nginx locations that answer 404 themselves, as regular expressions nginx would match (~* : case-insensitive). */
const refusedLocations = [...nginx.matchAll(/location\s+~\*\s+(\S+)\s*\{\s*return 404;\s*\}/g)].map(([, re]) => new RegExp(re, 'i'));
/** Whether nginx forwards `path` to the api: a refusing regex location wins over the prefix location /. */
const forwarded = (path: string) => !refusedLocations.some((re) => re.test(path));

describe('docker-compose.yml publishes the API and Swagger UI only', () => {
  it('only the load balancer has a host port', () => {
    const published = Object.entries(compose.services)
      .filter(([, service]) => service.ports?.length)
      .map(([name]) => name);
    expect(published).toEqual(['lb']);
  });

  it('the api mounts no sandbox: it names a provider, which runs in a container of its own without a host port', () => {
    const api = compose.services.api.environment ?? {};
    expect(api.PSP_SANDBOX).toBeUndefined();
    expect(api.PSP_BASE_URL).toContain('http://psp:4000/psp');
    expect(compose.services.psp.command).toEqual(['node', 'dist/apps/psp-sandbox/src/main.js']);
    expect(compose.services.psp.ports).toBeUndefined();
  });

  it('fulfilment (no host port) takes its bearer token from whoever runs compose: no default, which would be published here', () => {
    expect(compose.services.fulfilment.ports).toBeUndefined();
    expect(compose.services.fulfilment.environment?.FULFILMENT_API_TOKEN).toMatch(/^\$\{FULFILMENT_API_TOKEN:\?[^}]+\}$/);
  });

  it('the api and the sandbox share a provider key that compose requires from the environment, with no default', () => {
    const required = /^\$\{PSP_API_KEY:\?[^}]+\}$/;
    expect(compose.services.api.environment?.PSP_API_KEY).toMatch(required);
    expect(compose.services.psp.environment?.PSP_API_KEY).toMatch(required);
  });

  it.each(['/orders', '/orders/abc', '/docs', '/docs-json', '/docs/static/index.html', '/health', '/webhooks/psp', '/patterns/x.md'])(
    'forwards %s',
    (path) => expect(forwarded(path)).toBe(true),
  );

  it.each(['/psp', '/psp/charges', '/PSP/charges?orderId=x', '/metrics', '/Metrics', '/metrics/'])('refuses %s', (path) =>
    expect(forwarded(path)).toBe(false),
  );
});
