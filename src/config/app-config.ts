/**
 * The service's configuration: read from the environment once, validated once, typed.
 * A bad value stops start-up with a message that names the variable (see `ConfigError`); every bad
 * or missing variable is named at once, not one per start.
 */
import { isIP } from 'node:net';
import {
  BEARER_SECRET_FORMAT,
  ConfigError,
  listenHost as readListenHost,
  LOG_LEVEL_NAMES,
  type LogLevelName,
  looksHandTyped,
  MIN_DISTINCT_CHARACTERS,
  MIN_PRODUCTION_SECRET_LENGTH,
} from '#service-kit';

export interface ApiClient {
  clientId: string;
  secret: string;
}

export interface AppConfig {
  /** NODE_ENV=production: every published development default (keys, secret, sandbox) is refused, and weak secrets too. */
  production: boolean;
  port: number;
  /** HOST: the address to listen on. Default: 127.0.0.1 in development (nobody else reaches the dev key), 0.0.0.0 in production. */
  host: string;
  /**
   * TRUST_PROXY: the addresses of the proxies in front (compose's nginx: `uniquelocal`). X-Forwarded-For is believed only
   * from them, so the client's address (failed authentications are limited per address) cannot be written by the client.
   */
  trustProxy?: string[];
  /** Unset: the service starts an embedded PostgreSQL in `embeddedPgDir`. */
  databaseUrl?: string;
  /** DATABASE_MIGRATION_URL: a direct connection for the migrations (and their lock) when DATABASE_URL goes through a pooler. */
  databaseMigrationUrl?: string;
  embeddedPgDir: string;
  embeddedPgPort: number;
  apiClients: ApiClient[];
  /** True when API_KEYS was not given and the dev default is in use (embedded runs only). */
  usingDevApiKey: boolean;
  idempotencyTtlSeconds: number;
  idempotencyWaitMs: number;
  idempotencyLeaseSeconds: number;
  /** Completed keys whose answers this process keeps for replays; 0: every replay reads the database. */
  idempotencyReplayCacheEntries: number;
  /**
   * IDEMPOTENCY_ENCRYPTION_KEYS: stored answers sealed with the first key, read with any (a rotation keeps the old one
   * until its answers expire). Unset: stored in plain, which only development allows (NODE_ENV=production requires it).
   */
  idempotencyEncryption?: { keys: Record<string, Buffer>; current: string };
  databasePoolSize: number;
  databasePoolWaitMs: number;
  /**
   * DATABASE_PREPARED_STATEMENTS: named (server-side prepared) statements. Unset: on, unless the
   * connection looks pooled (then start-up asks for a choice); false behind a pooler that cannot keep them.
   */
  databasePreparedStatements?: boolean;
  /**
   * DATABASE_REQUIRE_SYNCHRONOUS_STANDBY: refuse to start when the primary acknowledges commits alone (no synchronous
   * standby), as a failover could then lose acknowledged writes. Off: said at start-up, warned in production.
   */
  databaseRequireSynchronousStandby: boolean;
  submitTokenTtlSeconds: number;
  pspBaseUrl?: string;
  /**
   * Where the sandbox provider runs: `in-process` mounts it on this service's port (the embedded
   * database, or PSP_SANDBOX=in-process); `off` when PSP_BASE_URL names a provider.
   */
  pspSandbox: 'in-process' | 'off';
  /** True when the sandbox is mounted on a real database because PSP_SANDBOX asked for it: warned at start-up. */
  pspSandboxOptedIn: boolean;
  /**
   * How late the provider may still act on a request after it was sent (a queue in a load balancer,
   * a retrying proxy): until then an abandoned attempt is "maybe still on its way", and nobody may
   * decide that the provider never saw it.
   */
  pspMaxLatencyMs: number;
  /** How long the provider remembers an Idempotency-Key: a payment is re-sent under its outbound key only within it. */
  pspKeyRetentionHours: number;
  pspTimeoutMs: number;
  /** Attempts per outbound call, the first included (docs/contract.md#outbound-client). */
  pspMaxAttempts: number;
  /** Consecutive failed calls that open a circuit breaker. */
  pspBreakerThreshold: number;
  /** How long an open breaker refuses calls before it lets one through to test the provider. */
  pspBreakerHalfOpenMs: number;
  /** PSP_API_KEY: the provider's secret key, sent with every call (`Authorization: Bearer`); the in-process sandbox takes it. */
  pspApiKey: string;
  /** True when PSP_API_KEY was not given and the published dev key is in use (development only). */
  usingDevPspApiKey: boolean;
  /** `whsec_<base64>` (Standard Webhooks). */
  pspWebhookSecret: string;
  /** True when PSP_WEBHOOK_SECRET was not given and the dev default is in use (embedded runs only). */
  usingDevWebhookSecret: boolean;
  /**
   * Where the sandbox provider delivers its webhooks: `self` = this service's own `/webhooks/psp`
   * (its URL is known only once it listens), `url` = PSP_WEBHOOK_URL, `none` = PSP_WEBHOOK_URL=none,
   * no delivery at all (payments then settle through their requests and the reconciler alone).
   */
  pspWebhookDelivery: { to: 'self' } | { to: 'url'; url: string } | { to: 'none' };
  /** The sandbox sends every webhook twice (tests and demos of the deduplicating consumer). */
  pspWebhookDuplicates: boolean;
  /** Period of the reconciler of unfinished payments and refunds; 0: it never runs. */
  reconcileIntervalMs: number;
  /** Period of the sweep of the provider's recent charges for payments we do not have (ProviderChargeSweep); 0: never. */
  providerSweepIntervalMs: number;
  /**
   * AMQP_URL: the RabbitMQ the order events are published to — one URL, or a cluster's nodes comma-separated (tried in
   * order, the next on a lost connection). Unset: the relay is off and events wait in the outbox.
   */
  amqpUrls?: string[];
  /** How long a relay's claim keeps an outbox row from the other relays; a row whose relay died is sent again after it. */
  orderEventsLeaseMs: number;
  /** Test-only fault: `die-after-confirm` kills the process between the broker's confirm and the row's mark. */
  orderEventsRelayFault?: 'die-after-confirm';
  logLevel: LogLevelName;
}

/** The dev key printed at start-up for the embedded run; never accepted when DATABASE_URL is set. */
export const DEV_API_CLIENT: ApiClient = { clientId: 'demo', secret: 'dev-secret-change-me' };

/**
 * The webhook secret of the embedded run (32 bytes: `whsec_` + base64 of "dev-only-webhook-secret-change!!").
 * Published in this repository, so never accepted when DATABASE_URL is set.
 */
export const DEV_WEBHOOK_SECRET = 'whsec_ZGV2LW9ubHktd2ViaG9vay1zZWNyZXQtY2hhbmdlISE=';

/**
 * The provider key of the development run, taken by the in-process sandbox and sent by the client. Published in this
 * repository, so refused wherever the other dev defaults are (see `deployment`).
 */
export const DEV_PSP_API_KEY = 'sk_test_dev-only-psp-key-change-me';

/**
 * Slack the lease keeps beyond the outbound client's attempts, for the phase-1 and phase-3 transactions (docs/contract.md#outbound-client).
 */
export const LEASE_MARGIN_MS = 2_000;

type Env = Record<string, string | undefined>;

/** The problems found so far in each environment being read (see readingAll). */
const problemsOf = new WeakMap<Env, ConfigError[]>();

/** Records `error` for `env` and carries on with `fallback`, so that the next variables are checked too. */
function invalid<T>(env: Env, error: ConfigError, fallback: T): T {
  const problems = problemsOf.get(env);
  if (!problems) throw error;
  problems.push(error);
  return fallback;
}

/** Runs `read` over `env`, then throws one ConfigError naming every problem it found (one thrown directly included). */
function readingAll<T>(env: Env, read: () => T): T {
  if (problemsOf.has(env)) return read();
  const problems: ConfigError[] = [];
  problemsOf.set(env, problems);
  let config: T | undefined;
  try {
    config = read();
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    problems.push(err);
  } finally {
    problemsOf.delete(env);
  }
  if (problems.length) throw ConfigError.of(problems);
  return config as T;
}

const hasProblem = (env: Env, ...variables: string[]) => problemsOf.get(env)?.some((e) => variables.includes(e.variable)) ?? false;

function integer(env: Env, name: string, fallback: number, min: number, max: number): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  if (!/^\d+$/.test(raw.trim()) || Number(raw) < min || Number(raw) > max) {
    return invalid(env, new ConfigError(name, `must be a whole number from ${min} to ${max}`, raw), fallback);
  }
  return Number(raw);
}

/** A URL as it may be printed: any password (or a value too broken to parse) is hidden. */
export function printableUrl(raw: string): string {
  try {
    const parsed = new URL(raw);
    if (parsed.password) parsed.password = '***';
    return parsed.toString();
  } catch {
    return raw.includes('@') ? '***' : raw;
  }
}

function boolean(env: Env, name: string, fallback: boolean): boolean {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  // Only the two words: "0", "yes" or "TRUE" would each be someone's guess at the other meaning.
  if (raw !== 'true' && raw !== 'false') return invalid(env, new ConfigError(name, 'must be true or false', raw), fallback);
  return raw === 'true';
}

function url(env: Env, name: string, protocols: string[]): string | undefined {
  const raw = env[name];
  if (raw === undefined || raw === '') return undefined;
  let parsed: URL;
  try {
    parsed = new URL(raw);
  } catch {
    return invalid(env, new ConfigError(name, 'must be a URL', printableUrl(raw)), undefined);
  }
  if (!protocols.includes(parsed.protocol)) {
    return invalid(env, new ConfigError(name, `must use ${protocols.join(' or ')}`, printableUrl(raw)), undefined);
  }
  return raw;
}

/** A comma-separated list of URLs, each checked as `url` checks one; an empty entry is refused. */
function urlList(env: Env, name: string, protocols: string[]): string[] | undefined {
  const raw = env[name];
  if (raw === undefined || raw === '') return undefined;
  const urls: string[] = [];
  for (const entry of raw.split(',').map((part) => part.trim())) {
    if (entry === '')
      return invalid(env, new ConfigError(name, 'has an empty entry in its comma-separated list', printableUrl(raw)), undefined);
    const checked = url({ ...env, [name]: entry }, name, protocols);
    if (checked === undefined) return undefined;
    urls.push(checked);
  }
  return urls;
}

/** Only the client ids of API_KEYS are ever printed. */
const printableKeys = (raw: string) =>
  raw
    .split(',')
    .map((pair) => `${pair.split(':')[0].split('=')[0].trim()}:***`)
    .join(',');

function apiClients(env: Env, raw: string, production: boolean): ApiClient[] {
  const clients = raw.split(',').map((pair) => {
    const at = pair.indexOf(':');
    return { at, clientId: pair.slice(0, at).trim(), secret: pair.slice(at + 1).trim() };
  });
  if (clients.some(({ at, clientId, secret }) => at < 1 || !/^[A-Za-z0-9._-]{1,64}$/.test(clientId) || secret.length < 16)) {
    const problem = 'must be a comma-separated list of clientId:secret (clientId of letters, digits, ._-; secret of 16+ characters)';
    return invalid(env, new ConfigError('API_KEYS', problem, printableKeys(raw)), []);
  }
  // One client id may appear with several secrets (a rotation: add the new key, deploy, remove the old); a secret names one client.
  const secrets = new Set(clients.map((c) => c.secret));
  if (secrets.size !== clients.length) {
    return invalid(env, new ConfigError('API_KEYS', 'must not repeat a secret', printableKeys(raw)), []);
  }
  // The published dev key is refused by a rule of its own, which says why; the length floor of 16 holds everywhere.
  const weak = clients.filter(({ secret }) => secret !== DEV_API_CLIENT.secret && looksHandTyped(secret));
  if (production && weak.length) {
    const problem =
      `must hold generated secrets when NODE_ENV=production: ${weak.map((c) => c.clientId).join(', ')} ` +
      `has a secret under ${MIN_PRODUCTION_SECRET_LENGTH} characters or of fewer than ${MIN_DISTINCT_CHARACTERS} different ones (e.g. openssl rand -hex 16)`;
    return invalid(env, new ConfigError('API_KEYS', problem, printableKeys(raw)), []);
  }
  return clients.map(({ clientId, secret }) => ({ clientId, secret }));
}

/** A Standard Webhooks secret: `whsec_` + base64 of at least 16 random bytes (the prefix is optional, as for the library). */
function webhookSecret(env: Env, raw: string, production: boolean): string {
  const encoded = raw.startsWith('whsec_') ? raw.slice('whsec_'.length) : raw;
  const wellFormed = /^[A-Za-z0-9+/]+={0,2}$/.test(encoded) && encoded.length % 4 === 0;
  const bytes = Buffer.from(encoded, 'base64');
  if (!wellFormed || bytes.length < 16) {
    // The value is never printed: even a malformed secret may be a real one with a typo.
    return invalid(env, new ConfigError('PSP_WEBHOOK_SECRET', 'must be whsec_ followed by the base64 of at least 16 bytes', '***'), raw);
  }
  // 16 random bytes hold about 15 different values (fewer than 8: odds of 1e-12); 16 zero bytes hold one.
  if (production && new Set(bytes).size < MIN_DISTINCT_CHARACTERS) {
    const problem = `must be random bytes when NODE_ENV=production (these hold fewer than ${MIN_DISTINCT_CHARACTERS} different values): whsec_ + openssl rand -base64 32`;
    return invalid(env, new ConfigError('PSP_WEBHOOK_SECRET', problem, '***'), raw);
  }
  return raw;
}

/**
 * PSP_API_KEY: what the provider issued (any token a bearer header can carry), or the dev key where the dev defaults
 * are accepted. Never printed: a malformed key may be the real one with a typo.
 */
function pspApiKey(env: Env, deployed: string | undefined, production: boolean): string {
  const raw = env.PSP_API_KEY?.trim() || undefined;
  if (raw === undefined || raw === DEV_PSP_API_KEY) {
    if (!deployed) return DEV_PSP_API_KEY;
    // Whoever read the repository could have the provider charge, or fail, any payment they name (issue 38).
    const problem = `is required when ${deployed}, and must not be the published dev key`;
    return invalid(env, new ConfigError('PSP_API_KEY', problem, raw ? '***' : ''), DEV_PSP_API_KEY);
  }
  if (!BEARER_SECRET_FORMAT.test(raw))
    return invalid(env, new ConfigError('PSP_API_KEY', 'must be 16 to 512 visible characters without spaces', '***'), raw);
  if (production && looksHandTyped(raw)) {
    const problem =
      `must be generated when NODE_ENV=production: it is under ${MIN_PRODUCTION_SECRET_LENGTH} characters or of fewer than ` +
      `${MIN_DISTINCT_CHARACTERS} different ones (your provider's key; for the sandbox, openssl rand -hex 16)`;
    return invalid(env, new ConfigError('PSP_API_KEY', problem, '***'), raw);
  }
  return raw;
}

/** Only the usual three words: "prod" or "Production" must not quietly mean development (and its defaults). */
function nodeEnv(env: Env): string | undefined {
  const raw = env.NODE_ENV?.trim();
  if (!raw) return undefined;
  if (!['production', 'development', 'test'].includes(raw))
    return invalid(env, new ConfigError('NODE_ENV', 'must be production, development or test (or unset: development)', raw), 'production');
  return raw;
}

/**
 * Why the published development defaults are refused, or undefined in development. They are in this repository,
 * so they must never guard real data (DATABASE_URL), sign for a real provider (PSP_BASE_URL), or run in production.
 */
function deployment(env: Env, databaseUrl: string | undefined): string | undefined {
  if (databaseUrl) return 'DATABASE_URL is set';
  if (env.NODE_ENV?.trim() === 'production') return 'NODE_ENV=production';
  if (env.PSP_BASE_URL?.trim()) return 'PSP_BASE_URL names a real provider';
  return undefined;
}

/** HOST: where to listen (the rule, loopback in development, is #service-kit's, shared with the fulfilment consumer). */
function listenHost(env: Env, production: boolean): string {
  const { host, problem } = readListenHost(env.HOST, production);
  return problem ? invalid(env, new ConfigError('HOST', problem, env.HOST?.trim() ?? ''), host) : host;
}

/** The names proxy-addr (Fastify's trustProxy) knows for whole address ranges. */
const ADDRESS_RANGE_NAMES = ['loopback', 'linklocal', 'uniquelocal'];

/**
 * TRUST_PROXY: `10.0.0.7,10.1.0.0/16` or a range's name (`loopback`, `linklocal`, `uniquelocal`). Unset: no header is
 * believed, the socket's address is the client's. Not a hop count: Fastify believes no header on a count alone, as
 * nothing then says that the peer is a proxy.
 */
function trustedProxies(env: Env): string[] | undefined {
  const raw = env.TRUST_PROXY?.trim();
  if (!raw) return undefined;
  const entries = raw.split(',').map((entry) => entry.trim());
  const valid = (entry: string) => {
    if (ADDRESS_RANGE_NAMES.includes(entry)) return true;
    const [address, prefix, ...rest] = entry.split('/');
    const family = isIP(address);
    if (family === 0 || rest.length > 0) return false;
    return prefix === undefined || (/^\d+$/.test(prefix) && Number(prefix) <= (family === 4 ? 32 : 128));
  };
  if (entries.every(valid)) return entries;
  const problem = `must be proxy addresses or CIDR ranges, comma-separated, or one of ${ADDRESS_RANGE_NAMES.join(', ')}`;
  return invalid(env, new ConfigError('TRUST_PROXY', problem, raw), undefined);
}

/**
 * `id:base64,id:base64`, each key 32 random bytes (AES-256), the first the one that seals. Only the ids are ever printed.
 * Required in production: a default that stores customers' names and addresses in plain text fails open.
 */
function encryptionKeys(env: Env): AppConfig['idempotencyEncryption'] {
  const name = 'IDEMPOTENCY_ENCRYPTION_KEYS';
  const raw = env[name]?.trim();
  if (!raw) {
    if (env.NODE_ENV !== 'production') return undefined;
    const problem =
      'is required when NODE_ENV=production: id:base64 of 32 random bytes (openssl rand -base64 32), comma-separated, the first one current';
    return invalid(env, new ConfigError(name, problem, ''), undefined);
  }
  const pairs = raw.split(',').map((pair) => {
    const at = pair.indexOf(':');
    return { at, id: pair.slice(0, Math.max(0, at)).trim(), encoded: pair.slice(at + 1).trim() };
  });
  const printable = pairs.map(({ id }) => `${id}:***`).join(',');
  const keys: Record<string, Buffer> = {};
  for (const { at, id, encoded } of pairs) {
    const wellFormed = at > 0 && /^[A-Za-z0-9._-]{1,64}$/.test(id) && /^[A-Za-z0-9+/]+={0,2}$/.test(encoded) && encoded.length % 4 === 0;
    if (!wellFormed || Buffer.from(encoded, 'base64').length !== 32) {
      const problem = 'must be a comma-separated list of id:key, id of letters, digits, ._- and key the base64 of 32 random bytes';
      return invalid(env, new ConfigError(name, problem, printable), undefined);
    }
    if (id in keys) return invalid(env, new ConfigError(name, 'must not repeat a key id', printable), undefined);
    keys[id] = Buffer.from(encoded, 'base64');
  }
  return { keys, current: pairs[0].id };
}

/**
 * The sandbox answers test tokens as payments for whoever holds its key (PSP_API_KEY): on a real database it is
 * mounted only when asked for by name, so a deployment that forgets PSP_BASE_URL does not start.
 */
function pspSandbox(
  env: Env,
  databaseUrl: string | undefined,
  pspBaseUrl: string | undefined,
  production: boolean,
): Pick<AppConfig, 'pspSandbox' | 'pspSandboxOptedIn'> {
  const raw = env.PSP_SANDBOX?.trim() || undefined;
  const off = { pspSandbox: 'off', pspSandboxOptedIn: false } as const;
  if (raw !== undefined && raw !== 'in-process')
    return invalid(env, new ConfigError('PSP_SANDBOX', 'must be in-process or unset', raw), off);
  if (production && raw)
    return invalid(
      env,
      new ConfigError(
        'PSP_SANDBOX',
        'must be unset when NODE_ENV=production: the sandbox is a development tool that charges for anyone',
        raw,
      ),
      off,
    );
  if (production && !pspBaseUrl && !hasProblem(env, 'PSP_BASE_URL')) {
    const problem = 'is required when NODE_ENV=production: the in-process sandbox is mounted in development only';
    return invalid(env, new ConfigError('PSP_BASE_URL', problem, ''), off);
  }
  if (pspBaseUrl) {
    if (raw)
      return invalid(
        env,
        new ConfigError('PSP_SANDBOX', 'must be unset when PSP_BASE_URL names the provider (set one of the two)', raw),
        off,
      );
    return off;
  }
  if (databaseUrl && !raw) {
    const problem =
      'is required when DATABASE_URL is set: name your payment provider, or set PSP_SANDBOX=in-process to mount the test sandbox on this port (demos only)';
    return invalid(env, new ConfigError('PSP_BASE_URL', problem, ''), off);
  }
  return { pspSandbox: 'in-process', pspSandboxOptedIn: databaseUrl !== undefined };
}

function webhookDelivery(env: Env): AppConfig['pspWebhookDelivery'] {
  const raw = env.PSP_WEBHOOK_URL;
  if (raw === 'none') return { to: 'none' };
  if (raw === undefined || raw === '') return { to: 'self' };
  let web = false;
  try {
    web = ['http:', 'https:'].includes(new URL(raw).protocol);
  } catch {
    // Not a URL: refused below.
  }
  if (web) return { to: 'url', url: raw };
  return invalid(env, new ConfigError('PSP_WEBHOOK_URL', 'must be an http(s) URL or the word none', printableUrl(raw)), { to: 'self' });
}

/** 0 turns the reconciler off; anything else is a period of at least 100 ms, so it cannot spin. */
function reconcileInterval(env: Env): number {
  const ms = integer(env, 'RECONCILE_INTERVAL_MS', 30_000, 0, 86_400_000);
  if (ms !== 0 && ms < 100)
    return invalid(env, new ConfigError('RECONCILE_INTERVAL_MS', 'must be 0 (off) or from 100 to 86400000', String(ms)), ms);
  return ms;
}

/** 0 turns the sweep off; anything else is a period of at least 1 s (each run calls the provider). */
function providerSweepInterval(env: Env): number {
  const ms = integer(env, 'PROVIDER_SWEEP_INTERVAL_MS', 60_000, 0, 86_400_000);
  if (ms !== 0 && ms < 1_000)
    return invalid(env, new ConfigError('PROVIDER_SWEEP_INTERVAL_MS', 'must be 0 (off) or from 1000 to 86400000', String(ms)), ms);
  return ms;
}

/** Only for the at-least-once test: never set in a deployment (it kills the process on the first confirmed batch). */
function relayFault(env: Env): AppConfig['orderEventsRelayFault'] {
  const raw = env.ORDER_EVENTS_RELAY_FAULT;
  if (raw === undefined || raw === '') return undefined;
  if (raw !== 'die-after-confirm')
    return invalid(env, new ConfigError('ORDER_EVENTS_RELAY_FAULT', 'must be die-after-confirm or unset', raw), undefined);
  return raw;
}

/** PgBouncer's default port: a URL on it with named statements left at their default is almost surely a mistake. */
const PGBOUNCER_PORT = '6432';

function preparedStatements(env: Env, databaseUrl: string | undefined): boolean | undefined {
  if (env.DATABASE_PREPARED_STATEMENTS === undefined || env.DATABASE_PREPARED_STATEMENTS === '') {
    if (databaseUrl && new URL(databaseUrl).port === PGBOUNCER_PORT) {
      return invalid(
        env,
        new ConfigError(
          'DATABASE_PREPARED_STATEMENTS',
          `must be set when DATABASE_URL is on port ${PGBOUNCER_PORT} (PgBouncer's): false for a transaction pooler that cannot keep named statements (PgBouncer before 1.21), true for one that can (max_prepared_statements) or for PostgreSQL itself`,
          '',
        ),
        undefined,
      );
    }
    return undefined;
  }
  return boolean(env, 'DATABASE_PREPARED_STATEMENTS', true);
}

/** Where the database is: all the migration CLI needs (it serves no request, so no API or webhook secret). */
export type DatabaseConfig = Pick<AppConfig, 'databaseUrl' | 'databaseMigrationUrl' | 'embeddedPgDir' | 'embeddedPgPort'>;

export function loadDatabaseConfig(env: Env = process.env): DatabaseConfig {
  return readingAll(env, () => {
    const databaseUrl = url(env, 'DATABASE_URL', ['postgres:', 'postgresql:']);
    let databaseMigrationUrl = url(env, 'DATABASE_MIGRATION_URL', ['postgres:', 'postgresql:']);
    if (databaseMigrationUrl && !databaseUrl && !hasProblem(env, 'DATABASE_URL')) {
      databaseMigrationUrl = invalid(
        env,
        new ConfigError(
          'DATABASE_MIGRATION_URL',
          'needs DATABASE_URL (the embedded database is reached directly)',
          printableUrl(databaseMigrationUrl),
        ),
        undefined,
      );
    }
    return {
      databaseUrl,
      databaseMigrationUrl,
      embeddedPgDir: env.EMBEDDED_PG_DIR || '.data/postgres',
      // 54329: next to PostgreSQL's 5432 but off it, so a local server on 5432 does not collide.
      embeddedPgPort: integer(env, 'EMBEDDED_PG_PORT', 54329, 1024, 65535),
    };
  });
}

export function loadConfig(env: Env = process.env): AppConfig {
  return readingAll(env, () => readConfig(env));
}

function readConfig(env: Env): AppConfig {
  const { databaseUrl, databaseMigrationUrl, embeddedPgDir, embeddedPgPort } = loadDatabaseConfig(env);
  const production = nodeEnv(env) === 'production';
  const deployed = deployment(env, databaseUrl);
  const rawKeys = env.API_KEYS?.trim();
  if (!rawKeys && deployed) {
    // The dev key is published in the README: it must never guard real data or a real provider's charges.
    invalid(env, new ConfigError('API_KEYS', `is required when ${deployed}`, ''), undefined);
  }
  let logLevel = env.LOG_LEVEL || 'info';
  if (!(LOG_LEVEL_NAMES as readonly string[]).includes(logLevel)) {
    logLevel = invalid(env, new ConfigError('LOG_LEVEL', `must be one of ${LOG_LEVEL_NAMES.join(', ')}`, logLevel), 'info');
  }
  const clients = rawKeys ? apiClients(env, rawKeys, production) : [DEV_API_CLIENT];
  if (deployed && rawKeys && clients.some((client) => client.secret === DEV_API_CLIENT.secret)) {
    invalid(env, new ConfigError('API_KEYS', `must not use the published dev secret when ${deployed}`, printableKeys(rawKeys)), undefined);
  }
  const rawWebhookSecret = env.PSP_WEBHOOK_SECRET?.trim();
  if (deployed && (!rawWebhookSecret || rawWebhookSecret === DEV_WEBHOOK_SECRET)) {
    // Whoever knows the dev secret (everyone: it is in the repository) could forge "charge.succeeded".
    const problem = `is required when ${deployed}, and must not be the published dev secret`;
    invalid(env, new ConfigError('PSP_WEBHOOK_SECRET', problem, rawWebhookSecret ? '***' : ''), undefined);
  }
  const providerKey = pspApiKey(env, deployed, production);
  // 2 s per attempt: a card charge normally answers well under a second; past 2 s a retry under the same key is the better bet.
  const pspTimeoutMs = integer(env, 'PSP_TIMEOUT_MS', 2_000, 1, 60_000);
  // 5: a flaky provider's usual 1–2 transient errors are absorbed with room to spare; 3 is the floor
  // so the sandbox's tok_flaky (503 on the first 2 attempts) can still succeed.
  const pspMaxAttempts = integer(env, 'PSP_MAX_ATTEMPTS', 5, 3, 20);
  // 60 s: ample for the default retry budget (5 × 2 s + 2 s = 12 s) and still a short wait after a crash.
  const idempotencyLeaseSeconds = integer(env, 'IDEMPOTENCY_LEASE_SECONDS', 60, 1, 3_600);
  const retryBudgetMs = pspMaxAttempts * pspTimeoutMs + LEASE_MARGIN_MS;
  // Measured against the budget only when both of its factors are valid: otherwise it would be a guess.
  if (
    idempotencyLeaseSeconds * 1000 < retryBudgetMs &&
    !hasProblem(env, 'PSP_MAX_ATTEMPTS', 'PSP_TIMEOUT_MS', 'IDEMPOTENCY_LEASE_SECONDS')
  ) {
    // A lease that ends while its holder is still calling the provider lets a retry take over mid-call.
    invalid(
      env,
      new ConfigError(
        'IDEMPOTENCY_LEASE_SECONDS',
        `must be at least ${Math.ceil(retryBudgetMs / 1000)} to outlast the retry budget ` +
          `(PSP_MAX_ATTEMPTS ${pspMaxAttempts} × PSP_TIMEOUT_MS ${pspTimeoutMs} + ${LEASE_MARGIN_MS} ms)`,
        String(idempotencyLeaseSeconds),
      ),
      undefined,
    );
  }
  const pspBaseUrl = url(env, 'PSP_BASE_URL', ['http:', 'https:']);
  return {
    production,
    // 3000: what a Nest (or any Node) developer tries first. 0 = any free port (tests).
    port: integer(env, 'PORT', 3000, 0, 65535),
    host: listenHost(env, production),
    trustProxy: trustedProxies(env),
    databaseUrl,
    databaseMigrationUrl,
    embeddedPgDir,
    embeddedPgPort,
    apiClients: clients,
    usingDevApiKey: !rawKeys,
    // 24 h, as Stripe: long enough for a client's retries across an outage, short enough to bound the table.
    idempotencyTtlSeconds: integer(env, 'IDEMPOTENCY_TTL_SECONDS', 86_400, 1, 30 * 86_400),
    // A duplicate waits this long for the first request to finish before it gets 409 + Retry-After.
    idempotencyWaitMs: integer(env, 'IDEMPOTENCY_WAIT_MS', 5_000, 0, 60_000),
    idempotencyLeaseSeconds,
    // 10 000 answers of a few hundred bytes each: a few MB, enough for every key being retried at once.
    idempotencyReplayCacheEntries: integer(env, 'IDEMPOTENCY_REPLAY_CACHE_ENTRIES', 10_000, 0, 1_000_000),
    idempotencyEncryption: encryptionKeys(env),
    // 20 connections keep two cores busy; more only queue inside PostgreSQL instead of here.
    databasePoolSize: integer(env, 'DATABASE_POOL_SIZE', 20, 2, 500),
    // A request that cannot get a connection this fast is told to come back (503) instead of queueing without end.
    databasePoolWaitMs: integer(env, 'DATABASE_POOL_WAIT_MS', 5_000, 1, 60_000),
    databasePreparedStatements: preparedStatements(env, databaseUrl),
    databaseRequireSynchronousStandby: boolean(env, 'DATABASE_REQUIRE_SYNCHRONOUS_STANDBY', false),
    // 10 min: a form is filled in and submitted well within it; an abandoned token soon stops counting.
    submitTokenTtlSeconds: integer(env, 'SUBMIT_TOKEN_TTL_SECONDS', 600, 1, 86_400),
    pspBaseUrl,
    ...pspSandbox(env, databaseUrl, pspBaseUrl, production),
    // 5 min: a request queued behind a load balancer or a retrying proxy is acted on within seconds; minutes
    // is the bound real providers' own retries and queues stay inside. 0 trusts that a request is never late.
    pspMaxLatencyMs: integer(env, 'PSP_MAX_LATENCY_MS', 300_000, 0, 86_400_000),
    // 24 h, as Stripe keeps a key: past it the same key could make a new charge, so only lookups are safe.
    pspKeyRetentionHours: integer(env, 'PSP_KEY_RETENTION_HOURS', 24, 1, 720),
    pspTimeoutMs,
    pspMaxAttempts,
    // 5 consecutive failed calls (each already retried): the provider is down, not flaky; stop piling on.
    pspBreakerThreshold: integer(env, 'PSP_BREAKER_THRESHOLD', 5, 1, 1_000),
    // 10 s: short enough that a recovered provider is used again quickly, long enough to give it air.
    pspBreakerHalfOpenMs: integer(env, 'PSP_BREAKER_HALF_OPEN_MS', 10_000, 100, 600_000),
    pspApiKey: providerKey,
    usingDevPspApiKey: providerKey === DEV_PSP_API_KEY,
    pspWebhookSecret: rawWebhookSecret ? webhookSecret(env, rawWebhookSecret, production) : DEV_WEBHOOK_SECRET,
    usingDevWebhookSecret: !rawWebhookSecret,
    pspWebhookDelivery: webhookDelivery(env),
    // Off by default: the sandbox's webhooks arrive once unless a test or demo asks for duplicates.
    pspWebhookDuplicates: boolean(env, 'PSP_WEBHOOK_DUPLICATES', false),
    // 30 s: a payment stuck past its lease settles within about half a minute, at one cheap query per period.
    reconcileIntervalMs: reconcileInterval(env),
    // A minute: a failover's lost payments are refunded within about a minute of it, at one listing of the provider's charges made
    // since the last run per period. Not below a second: each run is at least one call to the provider.
    providerSweepIntervalMs: providerSweepInterval(env),
    amqpUrls: urlList(env, 'AMQP_URL', ['amqp:', 'amqps:']),
    // 30 s: far beyond a batch's publishes (each bounded by a 5 s confirm timeout), short enough after a crash.
    orderEventsLeaseMs: integer(env, 'ORDER_EVENTS_LEASE_MS', 30_000, 6_000, 3_600_000),
    orderEventsRelayFault: relayFault(env),
    logLevel: logLevel as AppConfig['logLevel'],
  };
}
