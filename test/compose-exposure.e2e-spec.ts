/**
 * What `docker compose up` publishes (issue 38), for each compose file the repository ships (docker-compose.yml, and
 * docker-compose.cluster.yml of issue 40): parsed as shipped, with deploy/nginx.conf. Only the load balancer has a host
 * port; it forwards the API and Swagger UI, never the sandbox provider (/psp) or /metrics; the api runs no in-process
 * sandbox (the image's NODE_ENV=production would refuse it anyway); the secrets, fulfilment's token among them, come from
 * whoever runs compose, with no default.
 */
import { readFileSync } from 'node:fs';
import { load, YAML11_SCHEMA } from 'js-yaml';

interface Service {
  ports?: unknown[];
  network_mode?: string;
  environment?: Record<string, string>;
  command?: string[];
}
const COMPOSE_FILES = ['docker-compose.yml', 'docker-compose.cluster.yml'];
/** As compose reads them: YAML 1.1, whose `<<` merges a shared block (x-…) into each service that names it. */
const services = (file: string) =>
  (load(readFileSync(file, 'utf8'), { schema: YAML11_SCHEMA }) as { services: Record<string, Service> }).services;
/** `${NAME:?message}`: compose stops, naming the variable, when it is unset or empty. */
const required = (name: string) => new RegExp(`^\\$\\{${name}:\\?[^}]+\\}$`);

const nginx = readFileSync('deploy/nginx.conf', 'utf8');
/** The nginx locations that answer 404 themselves, as regular expressions nginx would match (~* : case-insensitive). */
const refusedLocations = [...nginx.matchAll(/location\s+~\*\s+(\S+)\s*\{\s*return 404;\s*\}/g)].map(([, re]) => new RegExp(re, 'i'));
/** Whether nginx forwards `path` to the api: a refusing regex location wins over the prefix location /. */
const forwarded = (path: string) => !refusedLocations.some((re) => re.test(path));

describe.each(COMPOSE_FILES)('%s publishes the API and Swagger UI only', (file) => {
  it('only the load balancer has a host port, and no service shares the host network', () => {
    const compose = services(file);
    const published = Object.entries(compose)
      .filter(([, service]) => service.ports?.length || service.network_mode === 'host')
      .map(([name]) => name);
    expect(published).toEqual(['lb']);
    expect(compose.lb.network_mode).toBeUndefined();
  });

  it('the api mounts no sandbox: it names a provider, which runs in a container of its own without a host port', () => {
    const compose = services(file);
    const api = compose.api.environment ?? {};
    expect(api.PSP_SANDBOX).toBeUndefined();
    expect(api.PSP_BASE_URL).toContain('http://psp:4000/psp');
    expect(compose.psp.command).toEqual(['node', 'dist/apps/psp-sandbox/src/main.js']);
    expect(compose.psp.ports).toBeUndefined();
  });

  it('fulfilment (no host port) takes its bearer token from whoever runs compose: no default, which would be published here', () => {
    const compose = services(file);
    expect(compose.fulfilment.ports).toBeUndefined();
    expect(compose.fulfilment.environment?.FULFILMENT_API_TOKEN).toMatch(required('FULFILMENT_API_TOKEN'));
  });

  it('the api and the sandbox share a provider key that compose requires from the environment, with no default', () => {
    const compose = services(file);
    expect(compose.api.environment?.PSP_API_KEY).toMatch(required('PSP_API_KEY'));
    expect(compose.psp.environment?.PSP_API_KEY).toMatch(required('PSP_API_KEY'));
  });

  it.each(['API_KEYS', 'PSP_WEBHOOK_SECRET', 'IDEMPOTENCY_ENCRYPTION_KEYS'])(
    'the api requires %s from the environment, with no default',
    (name) => expect(services(file).api.environment?.[name]).toMatch(required(name)),
  );
});

describe('deploy/nginx.conf', () => {
  it.each(['/orders', '/orders/abc', '/docs', '/docs-json', '/docs/static/index.html', '/health', '/webhooks/psp', '/patterns/x.md'])(
    'forwards %s',
    (path) => expect(forwarded(path)).toBe(true),
  );

  it.each(['/psp', '/psp/charges', '/PSP/charges?orderId=x', '/metrics', '/Metrics', '/metrics/'])('refuses %s', (path) =>
    expect(forwarded(path)).toBe(false),
  );
});
