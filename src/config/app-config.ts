/**
 * The service's configuration: read from the environment once, validated once, typed.
 * A bad value stops start-up with a message that names the variable (see `ConfigError`).
 */
export interface ApiClient {
  clientId: string;
  secret: string;
}

export interface AppConfig {
  port: number;
  /** Unset: the service starts an embedded PostgreSQL in `embeddedPgDir`. */
  databaseUrl?: string;
  embeddedPgDir: string;
  embeddedPgPort: number;
  apiClients: ApiClient[];
  /** True when API_KEYS was not given and the dev default is in use (embedded runs only). */
  usingDevApiKey: boolean;
  idempotencyTtlSeconds: number;
  idempotencyWaitMs: number;
  idempotencyLeaseSeconds: number;
  databasePoolSize: number;
  databasePoolWaitMs: number;
  submitTokenTtlSeconds: number;
  pspBaseUrl?: string;
  pspTimeoutMs: number;
  pspWebhookSecret: string;
  pspWebhookUrl?: string;
  reconcileIntervalMs: number;
  logLevel: 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';
}

/** The dev key printed at start-up for the embedded run; never accepted when DATABASE_URL is set. */
export const DEV_API_CLIENT: ApiClient = { clientId: 'demo', secret: 'dev-secret-change-me' };

export class ConfigError extends Error {
  constructor(readonly variable: string, problem: string, value: string) {
    super(`Invalid configuration: ${variable} ${problem} (got ${JSON.stringify(value)})`);
    this.name = 'ConfigError';
  }
}

type Env = Record<string, string | undefined>;

function integer(env: Env, name: string, fallback: number, min: number, max: number): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  if (!/^\d+$/.test(raw.trim()) || Number(raw) < min || Number(raw) > max) {
    throw new ConfigError(name, `must be a whole number from ${min} to ${max}`, raw);
  }
  return Number(raw);
}

/** A URL as it may be printed: any password (or a value too broken to parse) is hidden. */
function printableUrl(raw: string): string {
  try {
    const parsed = new URL(raw);
    if (parsed.password) parsed.password = '***';
    return parsed.toString();
  } catch {
    return raw.includes('@') ? '***' : raw;
  }
}

function url(env: Env, name: string, protocols: string[]): string | undefined {
  const raw = env[name];
  if (raw === undefined || raw === '') return undefined;
  let parsed: URL;
  try {
    parsed = new URL(raw);
  } catch {
    throw new ConfigError(name, 'must be a URL', printableUrl(raw));
  }
  if (!protocols.includes(parsed.protocol)) {
    throw new ConfigError(name, `must use ${protocols.join(' or ')}`, printableUrl(raw));
  }
  return raw;
}

/** Only the client ids of API_KEYS are ever printed. */
const printableKeys = (raw: string) => raw.split(',').map((pair) => `${pair.split(':')[0].split('=')[0].trim()}:***`).join(',');

function apiClients(raw: string): ApiClient[] {
  const clients = raw.split(',').map((pair) => {
    const at = pair.indexOf(':');
    const clientId = pair.slice(0, at).trim();
    const secret = pair.slice(at + 1).trim();
    if (at < 1 || !/^[A-Za-z0-9._-]{1,64}$/.test(clientId) || secret.length < 16) {
      throw new ConfigError(
        'API_KEYS',
        'must be a comma-separated list of clientId:secret (clientId of letters, digits, ._-; secret of 16+ characters)',
        printableKeys(raw),
      );
    }
    return { clientId, secret };
  });
  const ids = new Set(clients.map((c) => c.clientId));
  const secrets = new Set(clients.map((c) => c.secret));
  if (ids.size !== clients.length || secrets.size !== clients.length) {
    throw new ConfigError('API_KEYS', 'must not repeat a clientId or a secret', printableKeys(raw));
  }
  return clients;
}

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;

export function loadConfig(env: Env = process.env): AppConfig {
  const databaseUrl = url(env, 'DATABASE_URL', ['postgres:', 'postgresql:']);
  const rawKeys = env.API_KEYS?.trim();
  if (!rawKeys && databaseUrl) {
    // The dev key is published in the README: it must never guard a real database.
    throw new ConfigError('API_KEYS', 'is required when DATABASE_URL is set', '');
  }
  const logLevel = env.LOG_LEVEL || 'info';
  if (!(LOG_LEVELS as readonly string[]).includes(logLevel)) {
    throw new ConfigError('LOG_LEVEL', `must be one of ${LOG_LEVELS.join(', ')}`, logLevel);
  }
  const pspWebhookSecret = env.PSP_WEBHOOK_SECRET || 'whsec_ZGV2LW9ubHktd2ViaG9vay1zZWNyZXQtY2hhbmdlISE=';
  if (pspWebhookSecret.length < 16) {
    throw new ConfigError('PSP_WEBHOOK_SECRET', 'must be at least 16 characters', '***');
  }
  return {
    port: integer(env, 'PORT', 3000, 0, 65535),
    databaseUrl,
    embeddedPgDir: env.EMBEDDED_PG_DIR || '.data/postgres',
    embeddedPgPort: integer(env, 'EMBEDDED_PG_PORT', 54329, 1024, 65535),
    apiClients: rawKeys ? apiClients(rawKeys) : [DEV_API_CLIENT],
    usingDevApiKey: !rawKeys,
    // 24 h, as Stripe: long enough for a client's retries across an outage, short enough to bound the table.
    idempotencyTtlSeconds: integer(env, 'IDEMPOTENCY_TTL_SECONDS', 86_400, 1, 30 * 86_400),
    // A duplicate waits this long for the first request to finish before it gets 409 + Retry-After.
    idempotencyWaitMs: integer(env, 'IDEMPOTENCY_WAIT_MS', 5_000, 0, 60_000),
    idempotencyLeaseSeconds: integer(env, 'IDEMPOTENCY_LEASE_SECONDS', 60, 1, 3_600),
    // 20 connections keep two cores busy; more only queue inside PostgreSQL instead of here.
    databasePoolSize: integer(env, 'DATABASE_POOL_SIZE', 20, 2, 500),
    // A request that cannot get a connection this fast is told to come back (503) instead of queueing without end.
    databasePoolWaitMs: integer(env, 'DATABASE_POOL_WAIT_MS', 5_000, 1, 60_000),
    submitTokenTtlSeconds: integer(env, 'SUBMIT_TOKEN_TTL_SECONDS', 600, 1, 86_400),
    pspBaseUrl: url(env, 'PSP_BASE_URL', ['http:', 'https:']),
    pspTimeoutMs: integer(env, 'PSP_TIMEOUT_MS', 2_000, 1, 60_000),
    pspWebhookSecret,
    pspWebhookUrl: url(env, 'PSP_WEBHOOK_URL', ['http:', 'https:']),
    reconcileIntervalMs: integer(env, 'RECONCILE_INTERVAL_MS', 30_000, 0, 3_600_000),
    logLevel: logLevel as AppConfig['logLevel'],
  };
}
