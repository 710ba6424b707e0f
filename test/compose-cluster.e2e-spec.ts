/**
 * docker-compose.cluster.yml (issue 40) against the topology `npm run test:ha` runs natively (test/support/ha-postgres.ts,
 * ha-rabbitmq.ts): parsed as shipped with its deploy/ files, since CI has no Docker engine to start it. What is checked
 * are the pairings it needs to start and to fail over as the harness does.
 */
import { readFileSync } from 'node:fs';
import { load, YAML11_SCHEMA } from 'js-yaml';

interface Service {
  build?: string | { context: string };
  image?: string;
  hostname?: string;
  environment?: Record<string, string>;
}
/** YAML 1.1, as compose and Patroni read them: `<<` merges the members' and the nodes' shared blocks into each. */
const compose = load(readFileSync('docker-compose.cluster.yml', 'utf8'), { schema: YAML11_SCHEMA }) as {
  services: Record<string, Service>;
};
const patroni = load(readFileSync('deploy/patroni/patroni.yml', 'utf8'), { schema: YAML11_SCHEMA }) as {
  bootstrap: {
    dcs: {
      synchronous_mode?: boolean;
      ttl: number;
      loop_wait: number;
      retry_timeout: number;
      postgresql: { parameters: Record<string, unknown> };
    };
  };
};
const haproxy = readFileSync('deploy/haproxy.cfg', 'utf8');
const rabbitmqConf = readFileSync('deploy/rabbitmq-cluster.conf', 'utf8');

const named = (match: (service: Service) => boolean) =>
  Object.entries(compose.services)
    .filter(([, service]) => match(service))
    .map(([name]) => name);
const members = named((s) => (typeof s.build === 'string' ? s.build : s.build?.context) === './deploy/patroni');
const nodes = named((s) => s.image?.startsWith('rabbitmq:') ?? false);
const env = (service: string) => compose.services[service].environment ?? {};
const host = (url: string) => new URL(url).hostname;
/** `key = value` lines of rabbitmq.conf (sysctl format). */
const conf = new Map(
  rabbitmqConf
    .split('\n')
    .filter((line) => /^\s*[^#\s]/.test(line))
    .map((line) => line.split('=').map((part) => part.trim()) as [string, string]),
);

describe('docker-compose.cluster.yml: the topology the HA tests run', () => {
  it('three Patroni members in synchronous mode, on the harness timings and durable writes', () => {
    expect(members).toEqual(['pg1', 'pg2', 'pg3']);
    for (const name of members) {
      expect(env(name)).toMatchObject({
        PATRONI_NAME: name,
        PATRONI_RESTAPI_CONNECT_ADDRESS: `${name}:8008`,
        PATRONI_POSTGRESQL_CONNECT_ADDRESS: `${name}:5432`,
      });
    }
    expect(patroni.bootstrap.dcs).toMatchObject({ synchronous_mode: true, ttl: 10, loop_wait: 2, retry_timeout: 4 });
    // The harness's fsync=off spares a test machine; a container's host can go down.
    expect(patroni.bootstrap.dcs.postgresql.parameters.fsync).toBeUndefined();
  });

  it('HAProxy routes to the member answering GET /primary, cutting the sessions of one marked down', () => {
    expect(haproxy).toMatch(/^\s*option httpchk GET \/primary$/m);
    expect(haproxy).toMatch(/^\s*http-check expect status 200$/m);
    expect(haproxy).toMatch(/^\s*default-server .*\bon-marked-down shutdown-sessions\b/m);
    const servers = [...haproxy.matchAll(/^\s*server (\S+) (\S+):5432 .*\bcheck port 8008\b/gm)].map(([, name, address]) => [
      name,
      address,
    ]);
    expect(servers).toEqual(members.map((name) => [name, name]));
  });

  it('the api, its migrations, the sandbox and fulfilment reach the primary through HAProxy; the api requires a synchronous standby', () => {
    for (const service of ['api', 'psp', 'fulfilment']) expect(host(env(service).DATABASE_URL)).toBe('haproxy');
    expect(env('api').DATABASE_MIGRATION_URL).toBe(env('api').DATABASE_URL);
    expect(env('api').DATABASE_PREPARED_STATEMENTS).toBe('true');
    expect(env('api').DATABASE_REQUIRE_SYNCHRONOUS_STANDBY).toBe('true');
  });

  it('three RabbitMQ nodes clustered from config, sharing a cookie compose requires; the api and fulfilment given every node', () => {
    expect(nodes).toEqual(['rabbitmq1', 'rabbitmq2', 'rabbitmq3']);
    expect(conf.get('cluster_formation.peer_discovery_backend')).toBe('classic_config');
    expect(nodes.map((_, i) => conf.get(`cluster_formation.classic_config.nodes.${i + 1}`))).toEqual(
      nodes.map((name) => `rabbit@${compose.services[name].hostname}`),
    );
    expect(nodes.map((name) => compose.services[name].hostname)).toEqual(nodes);
    expect(conf.get('net_ticktime')).toBe('10');
    expect(conf.get('cluster_partition_handling')).toBe('pause_minority');
    for (const name of nodes) expect(env(name).RABBITMQ_ERLANG_COOKIE).toMatch(/^\$\{RABBITMQ_ERLANG_COOKIE:\?[^}]+\}$/);
    for (const service of ['api', 'fulfilment']) expect(env(service).AMQP_URL.split(',').map(host)).toEqual(nodes);
  });
});
