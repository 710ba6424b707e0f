import { readFileSync } from 'node:fs';
import { DEV_API_CLIENT, DEV_PSP_API_KEY, DEV_WEBHOOK_SECRET, loadConfig } from './app-config.js';
import { ConfigError } from '#service-kit';

type Env = Record<string, string | undefined>;

/** Every variable the service reads (the configuration table in docs/running-it.md). */
const VARIABLES = [
  'NODE_ENV',
  'PORT',
  'HOST',
  'TRUST_PROXY',
  'DATABASE_URL',
  'DATABASE_MIGRATION_URL',
  'EMBEDDED_PG_DIR',
  'EMBEDDED_PG_PORT',
  'API_KEYS',
  'IDEMPOTENCY_TTL_SECONDS',
  'IDEMPOTENCY_WAIT_MS',
  'IDEMPOTENCY_LEASE_SECONDS',
  'IDEMPOTENCY_REPLAY_CACHE_ENTRIES',
  'IDEMPOTENCY_ENCRYPTION_KEYS',
  'DATABASE_POOL_SIZE',
  'DATABASE_POOL_WAIT_MS',
  'DATABASE_PREPARED_STATEMENTS',
  'DATABASE_REQUIRE_SYNCHRONOUS_STANDBY',
  'SUBMIT_TOKEN_TTL_SECONDS',
  'PSP_BASE_URL',
  'PSP_SANDBOX',
  'PSP_MAX_LATENCY_MS',
  'PSP_KEY_RETENTION_HOURS',
  'PSP_TIMEOUT_MS',
  'PSP_MAX_ATTEMPTS',
  'PSP_BREAKER_THRESHOLD',
  'PSP_BREAKER_HALF_OPEN_MS',
  'PSP_API_KEY',
  'PSP_WEBHOOK_SECRET',
  'PSP_WEBHOOK_URL',
  'PSP_WEBHOOK_DUPLICATES',
  'RECONCILE_INTERVAL_MS',
  'PROVIDER_SWEEP_INTERVAL_MS',
  'AMQP_URL',
  'ORDER_EVENTS_LEASE_MS',
  'ORDER_EVENTS_RELAY_FAULT',
  'LOG_LEVEL',
];

const PG_URL = 'postgres://app:pw@db.internal:5432/orders';
const KEYS = 'alice:alice-secret-0123456789,bob:bob-secret-0123456789';
/** A well-formed webhook secret: whsec_ + base64 of 32 bytes. */
const WEBHOOK_SECRET = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;
/** A provider's secret key as a provider issues one. */
const PSP_KEY = 'sk_live_4f8b1c9e2d7a6053b8e1f4c2a9d7e6b0';
/** What a real-database run must set at least. */
const REAL = {
  DATABASE_URL: PG_URL,
  API_KEYS: KEYS,
  PSP_WEBHOOK_SECRET: WEBHOOK_SECRET,
  PSP_API_KEY: PSP_KEY,
  PSP_BASE_URL: 'https://psp.example.com',
};

/** What production accepts: generated-looking keys and secret (app-config refuses hand-typed ones there). */
const REAL_IN_PRODUCTION = {
  ...REAL,
  NODE_ENV: 'production',
  API_KEYS: 'alice:3f9c2a7be41d8056c3e9f1a27b6d4e08',
  PSP_WEBHOOK_SECRET: `whsec_${Buffer.from(Array.from({ length: 32 }, (_, i) => i * 7)).toString('base64')}`,
};

/** A well-formed encryption key: base64 of 32 bytes. */
const ENCRYPTION_KEY = Buffer.alloc(32, 9).toString('base64');

/** The ConfigError loadConfig throws for env; fails the test when it accepts env or throws anything else. */
function configError(env: Env): ConfigError {
  let thrown: unknown;
  try {
    loadConfig(env);
  } catch (err) {
    thrown = err;
  }
  if (thrown === undefined) throw new Error(`loadConfig accepted ${JSON.stringify(env)}`);
  expect(thrown).toBeInstanceOf(ConfigError);
  return thrown as ConfigError;
}

describe('.env.example', () => {
  it('lists every variable the service reads, and no other', () => {
    // The file's last section is the fulfilment consumer's (test/fulfilment-config.e2e-spec.ts checks it).
    const listed = readFileSync('.env.example', 'utf8')
      .split('\n# --- The fulfilment consumer')[0]
      .split('\n')
      .map((line) => /^#?\s*([A-Z][A-Z0-9_]+)=/.exec(line)?.[1])
      .filter((name): name is string => name !== undefined);
    expect(new Set(listed)).toEqual(new Set(VARIABLES));
  });
});

describe('loadConfig: defaults', () => {
  it('an empty environment is an embedded dev run with every documented default', () => {
    expect(loadConfig({})).toEqual({
      production: false,
      port: 3000,
      host: '127.0.0.1',
      databaseUrl: undefined,
      embeddedPgDir: '.data/postgres',
      embeddedPgPort: 54329,
      apiClients: [DEV_API_CLIENT],
      usingDevApiKey: true,
      idempotencyTtlSeconds: 86_400,
      idempotencyWaitMs: 5_000,
      idempotencyLeaseSeconds: 60,
      idempotencyReplayCacheEntries: 10_000,
      databasePoolSize: 20,
      databasePoolWaitMs: 5000,
      databaseRequireSynchronousStandby: false,
      submitTokenTtlSeconds: 600,
      pspBaseUrl: undefined,
      pspSandbox: 'in-process',
      pspSandboxOptedIn: false,
      pspMaxLatencyMs: 300_000,
      pspKeyRetentionHours: 24,
      pspTimeoutMs: 2_000,
      pspMaxAttempts: 5,
      pspBreakerThreshold: 5,
      pspBreakerHalfOpenMs: 10_000,
      pspApiKey: DEV_PSP_API_KEY,
      usingDevPspApiKey: true,
      pspWebhookSecret: DEV_WEBHOOK_SECRET,
      usingDevWebhookSecret: true,
      pspWebhookDelivery: { to: 'self' },
      pspWebhookDuplicates: false,
      reconcileIntervalMs: 30_000,
      providerSweepIntervalMs: 60_000,
      amqpUrls: undefined,
      orderEventsLeaseMs: 30_000,
      orderEventsRelayFault: undefined,
      logLevel: 'info',
    });
  });

  it('treats empty strings (as an .env file writes them) like unset variables', () => {
    const empty = Object.fromEntries(VARIABLES.map((name) => [name, '']));
    expect(loadConfig(empty)).toEqual(loadConfig({}));
  });

  it('the dev API key is used only when API_KEYS is unset and the database is embedded', () => {
    const embedded = loadConfig({});
    expect(embedded.databaseUrl).toBeUndefined();
    expect(embedded.usingDevApiKey).toBe(true);
    expect(embedded.apiClients).toEqual([DEV_API_CLIENT]);

    const withKeys = loadConfig({ API_KEYS: KEYS });
    expect(withKeys.usingDevApiKey).toBe(false);
    expect(withKeys.apiClients.map((c) => c.clientId)).toEqual(['alice', 'bob']);
    expect(withKeys.apiClients).not.toContainEqual(DEV_API_CLIENT);

    const real = loadConfig(REAL);
    expect(real.databaseUrl).toBe(PG_URL);
    expect(real.usingDevApiKey).toBe(false);
    expect(real.apiClients).toEqual([
      { clientId: 'alice', secret: 'alice-secret-0123456789' },
      { clientId: 'bob', secret: 'bob-secret-0123456789' },
    ]);
    expect(real.apiClients.map((c) => c.secret)).not.toContain(DEV_API_CLIENT.secret);
  });

  it('reads every variable it is given', () => {
    const config = loadConfig({
      NODE_ENV: 'development',
      PORT: '8080',
      HOST: '::',
      DATABASE_URL: 'postgresql://u:p@localhost/db',
      EMBEDDED_PG_DIR: '/var/lib/io',
      EMBEDDED_PG_PORT: '6543',
      API_KEYS: ' alice : alice-secret-0123456789 ',
      IDEMPOTENCY_TTL_SECONDS: '3600',
      IDEMPOTENCY_WAIT_MS: '0',
      IDEMPOTENCY_LEASE_SECONDS: '30',
      IDEMPOTENCY_REPLAY_CACHE_ENTRIES: '0',
      DATABASE_POOL_SIZE: '8',
      DATABASE_POOL_WAIT_MS: '250',
      DATABASE_REQUIRE_SYNCHRONOUS_STANDBY: 'true',
      TRUST_PROXY: '10.0.0.7, 10.1.0.0/16',
      SUBMIT_TOKEN_TTL_SECONDS: '120',
      PSP_BASE_URL: 'https://psp.example.com',
      PSP_MAX_LATENCY_MS: '4000',
      PSP_KEY_RETENTION_HOURS: '48',
      PSP_TIMEOUT_MS: '1500',
      PSP_MAX_ATTEMPTS: '4',
      PSP_BREAKER_THRESHOLD: '3',
      PSP_BREAKER_HALF_OPEN_MS: '2500',
      PSP_API_KEY: ` ${PSP_KEY} `,
      PSP_WEBHOOK_SECRET: WEBHOOK_SECRET,
      PSP_WEBHOOK_URL: 'http://localhost:8080/webhooks/psp',
      PSP_WEBHOOK_DUPLICATES: 'true',
      RECONCILE_INTERVAL_MS: '0',
      PROVIDER_SWEEP_INTERVAL_MS: '0',
      AMQP_URL: 'amqp://mq.internal:5672',
      ORDER_EVENTS_LEASE_MS: '60000',
      ORDER_EVENTS_RELAY_FAULT: 'die-after-confirm',
      LOG_LEVEL: 'debug',
    });
    expect(config).toEqual({
      production: false,
      port: 8080,
      host: '::',
      databaseUrl: 'postgresql://u:p@localhost/db',
      embeddedPgDir: '/var/lib/io',
      embeddedPgPort: 6543,
      apiClients: [{ clientId: 'alice', secret: 'alice-secret-0123456789' }],
      usingDevApiKey: false,
      idempotencyTtlSeconds: 3600,
      idempotencyWaitMs: 0,
      idempotencyLeaseSeconds: 30,
      idempotencyReplayCacheEntries: 0,
      databasePoolSize: 8,
      databasePoolWaitMs: 250,
      databaseRequireSynchronousStandby: true,
      trustProxy: ['10.0.0.7', '10.1.0.0/16'],
      submitTokenTtlSeconds: 120,
      pspBaseUrl: 'https://psp.example.com',
      pspSandbox: 'off',
      pspSandboxOptedIn: false,
      pspMaxLatencyMs: 4000,
      pspKeyRetentionHours: 48,
      pspTimeoutMs: 1500,
      pspMaxAttempts: 4,
      pspBreakerThreshold: 3,
      pspBreakerHalfOpenMs: 2500,
      pspApiKey: PSP_KEY,
      usingDevPspApiKey: false,
      pspWebhookSecret: WEBHOOK_SECRET,
      usingDevWebhookSecret: false,
      pspWebhookDelivery: { to: 'url', url: 'http://localhost:8080/webhooks/psp' },
      pspWebhookDuplicates: true,
      reconcileIntervalMs: 0,
      providerSweepIntervalMs: 0,
      amqpUrls: ['amqp://mq.internal:5672'],
      orderEventsLeaseMs: 60_000,
      orderEventsRelayFault: 'die-after-confirm',
      logLevel: 'debug',
    });
  });
});

describe('loadConfig: the sandbox provider never serves a real database by accident', () => {
  const withoutProvider = { DATABASE_URL: PG_URL, API_KEYS: KEYS, PSP_WEBHOOK_SECRET: WEBHOOK_SECRET, PSP_API_KEY: PSP_KEY };

  it('is mounted in-process on the embedded database', () => {
    expect(loadConfig({})).toMatchObject({ pspSandbox: 'in-process', pspSandboxOptedIn: false });
  });

  it('with DATABASE_URL and no provider, start-up stops naming PSP_BASE_URL and PSP_SANDBOX', () => {
    const err = configError(withoutProvider);
    expect(err.variable).toBe('PSP_BASE_URL');
    expect(err.message).toContain('PSP_SANDBOX=in-process');
  });

  it('with DATABASE_URL, PSP_SANDBOX=in-process mounts it, flagged for the start-up warning', () => {
    expect(loadConfig({ ...withoutProvider, PSP_SANDBOX: 'in-process' })).toMatchObject({
      pspSandbox: 'in-process',
      pspSandboxOptedIn: true,
    });
  });

  it('a named provider turns it off; naming both, or another PSP_SANDBOX value, is refused', () => {
    expect(loadConfig(REAL)).toMatchObject({ pspSandbox: 'off', pspBaseUrl: 'https://psp.example.com' });
    expect(configError({ ...REAL, PSP_SANDBOX: 'in-process' }).variable).toBe('PSP_SANDBOX');
    expect(configError({ ...withoutProvider, PSP_SANDBOX: 'yes' }).variable).toBe('PSP_SANDBOX');
  });
});

describe('loadConfig: a bad value stops with a ConfigError naming the variable', () => {
  const cases: [variable: string, env: Env][] = [
    ['NODE_ENV', { NODE_ENV: 'prod' }],
    ['HOST', { HOST: 'example.com' }],
    ['HOST', { HOST: '300.1.1.1' }],
    ['TRUST_PROXY', { TRUST_PROXY: 'nginx' }],
    ['TRUST_PROXY', { TRUST_PROXY: '10.0.0.0/33' }],
    ['PORT', { PORT: 'abc' }],
    ['PORT', { PORT: '70000' }],
    ['PORT', { PORT: '-1' }],
    ['PORT', { PORT: '80.5' }],
    ['DATABASE_URL', { DATABASE_URL: 'not-a-url', API_KEYS: KEYS }],
    ['DATABASE_URL', { DATABASE_URL: 'http://x', API_KEYS: KEYS }],
    ['DATABASE_PREPARED_STATEMENTS', { DATABASE_PREPARED_STATEMENTS: 'yes' }],
    ['DATABASE_REQUIRE_SYNCHRONOUS_STANDBY', { DATABASE_REQUIRE_SYNCHRONOUS_STANDBY: 'yes' }],
    ['DATABASE_MIGRATION_URL', { ...REAL, DATABASE_MIGRATION_URL: 'not-a-url' }],
    ['DATABASE_MIGRATION_URL', { DATABASE_MIGRATION_URL: PG_URL }],
    ['API_KEYS', { API_KEYS: 'alice' }],
    ['API_KEYS', { API_KEYS: ':alice-secret-0123456789' }],
    ['API_KEYS', { API_KEYS: 'al ice:alice-secret-0123456789' }],
    ['API_KEYS', { API_KEYS: 'alice:alice-secret-0123456789,' }],
    ['API_KEYS', { API_KEYS: 'alice:short' }],
    ['API_KEYS', { API_KEYS: 'alice:alice-secret-0123456789,alice:alice-secret-0123456789' }],
    ['API_KEYS', { API_KEYS: 'alice:shared-secret-0123456789,bob:shared-secret-0123456789' }],
    ['API_KEYS', { DATABASE_URL: PG_URL }],
    ['API_KEYS', { DATABASE_URL: PG_URL, API_KEYS: '   ' }],
    ['IDEMPOTENCY_TTL_SECONDS', { IDEMPOTENCY_TTL_SECONDS: '0' }],
    ['IDEMPOTENCY_WAIT_MS', { IDEMPOTENCY_WAIT_MS: '-1' }],
    ['IDEMPOTENCY_LEASE_SECONDS', { IDEMPOTENCY_LEASE_SECONDS: 'x' }],
    ['IDEMPOTENCY_REPLAY_CACHE_ENTRIES', { IDEMPOTENCY_REPLAY_CACHE_ENTRIES: '-1' }],
    ['DATABASE_POOL_SIZE', { DATABASE_POOL_SIZE: '1' }],
    ['DATABASE_POOL_WAIT_MS', { DATABASE_POOL_WAIT_MS: '0' }],
    ['SUBMIT_TOKEN_TTL_SECONDS', { SUBMIT_TOKEN_TTL_SECONDS: 'x' }],
    ['PSP_BASE_URL', { API_KEYS: KEYS, PSP_WEBHOOK_SECRET: WEBHOOK_SECRET, PSP_API_KEY: PSP_KEY, PSP_BASE_URL: 'ftp://x' }],
    ['PSP_BASE_URL', { API_KEYS: KEYS, PSP_WEBHOOK_SECRET: WEBHOOK_SECRET, PSP_API_KEY: PSP_KEY, PSP_BASE_URL: 'not a url' }],
    ['PSP_MAX_LATENCY_MS', { PSP_MAX_LATENCY_MS: '-1' }],
    ['PSP_MAX_LATENCY_MS', { PSP_MAX_LATENCY_MS: '5m' }],
    ['PSP_KEY_RETENTION_HOURS', { PSP_KEY_RETENTION_HOURS: '0' }],
    ['PSP_SANDBOX', { PSP_SANDBOX: 'yes' }],
    ['PSP_TIMEOUT_MS', { PSP_TIMEOUT_MS: '0' }],
    ['PSP_MAX_ATTEMPTS', { PSP_MAX_ATTEMPTS: '2' }],
    ['PSP_MAX_ATTEMPTS', { PSP_MAX_ATTEMPTS: 'five' }],
    ['PSP_BREAKER_THRESHOLD', { PSP_BREAKER_THRESHOLD: '0' }],
    ['PSP_BREAKER_HALF_OPEN_MS', { PSP_BREAKER_HALF_OPEN_MS: '10s' }],
    ['PSP_WEBHOOK_SECRET', { PSP_WEBHOOK_SECRET: 'short' }],
    ['PSP_WEBHOOK_SECRET', { PSP_WEBHOOK_SECRET: 'whsec_not base64 at all!' }],
    ['PSP_WEBHOOK_SECRET', { PSP_WEBHOOK_SECRET: `whsec_${Buffer.alloc(15).toString('base64')}` }],
    ['PSP_WEBHOOK_SECRET', { DATABASE_URL: PG_URL, API_KEYS: KEYS }],
    ['PSP_WEBHOOK_SECRET', { DATABASE_URL: PG_URL, API_KEYS: KEYS, PSP_WEBHOOK_SECRET: '  ' }],
    ['PSP_WEBHOOK_SECRET', { DATABASE_URL: PG_URL, API_KEYS: KEYS, PSP_WEBHOOK_SECRET: DEV_WEBHOOK_SECRET }],
    ['PSP_API_KEY', { PSP_API_KEY: 'sk_short' }],
    ['PSP_API_KEY', { PSP_API_KEY: 'sk_test two words 0123456789' }],
    ['PSP_API_KEY', { PSP_API_KEY: `sk_test_${'x'.repeat(600)}` }],
    ['PSP_API_KEY', { ...REAL, PSP_API_KEY: '' }],
    ['PSP_API_KEY', { ...REAL, PSP_API_KEY: DEV_PSP_API_KEY }],
    ['PSP_API_KEY', { ...REAL, DATABASE_URL: undefined, PSP_API_KEY: undefined }],
    ['PSP_API_KEY', { ...REAL, PSP_BASE_URL: undefined, PSP_SANDBOX: 'in-process', PSP_API_KEY: undefined }],
    ['PSP_WEBHOOK_URL', { PSP_WEBHOOK_URL: 'ftp://x' }],
    ['PSP_WEBHOOK_URL', { PSP_WEBHOOK_URL: 'None' }],
    ['PSP_WEBHOOK_URL', { PSP_WEBHOOK_URL: 'off' }],
    ['PSP_WEBHOOK_DUPLICATES', { PSP_WEBHOOK_DUPLICATES: '1' }],
    ['PSP_WEBHOOK_DUPLICATES', { PSP_WEBHOOK_DUPLICATES: 'TRUE' }],
    ['PSP_WEBHOOK_DUPLICATES', { PSP_WEBHOOK_DUPLICATES: 'yes' }],
    ['RECONCILE_INTERVAL_MS', { RECONCILE_INTERVAL_MS: '-1' }],
    ['RECONCILE_INTERVAL_MS', { RECONCILE_INTERVAL_MS: '99' }],
    ['RECONCILE_INTERVAL_MS', { RECONCILE_INTERVAL_MS: '30s' }],
    ['PROVIDER_SWEEP_INTERVAL_MS', { PROVIDER_SWEEP_INTERVAL_MS: '999' }],
    ['PROVIDER_SWEEP_INTERVAL_MS', { PROVIDER_SWEEP_INTERVAL_MS: '-1' }],
    ['API_KEYS', { ...REAL, API_KEYS: `${DEV_API_CLIENT.clientId}:${DEV_API_CLIENT.secret}` }],
    ['API_KEYS', { ...REAL, API_KEYS: `${KEYS},ops:${DEV_API_CLIENT.secret}` }],
    ['IDEMPOTENCY_LEASE_SECONDS', { IDEMPOTENCY_LEASE_SECONDS: '11' }],
    ['IDEMPOTENCY_LEASE_SECONDS', { PSP_MAX_ATTEMPTS: '10', IDEMPOTENCY_LEASE_SECONDS: '21' }],
    ['IDEMPOTENCY_LEASE_SECONDS', { PSP_TIMEOUT_MS: '30000' }],
    ['AMQP_URL', { AMQP_URL: 'http://mq.internal' }],
    ['AMQP_URL', { AMQP_URL: 'not a url' }],
    ['ORDER_EVENTS_LEASE_MS', { ORDER_EVENTS_LEASE_MS: '5999' }],
    ['ORDER_EVENTS_RELAY_FAULT', { ORDER_EVENTS_RELAY_FAULT: 'true' }],
    ['LOG_LEVEL', { LOG_LEVEL: 'loud' }],
    ['IDEMPOTENCY_ENCRYPTION_KEYS', { IDEMPOTENCY_ENCRYPTION_KEYS: `k1:${Buffer.alloc(16, 1).toString('base64')}` }],
    ['IDEMPOTENCY_ENCRYPTION_KEYS', { IDEMPOTENCY_ENCRYPTION_KEYS: Buffer.alloc(32, 1).toString('base64') }],
    ['IDEMPOTENCY_ENCRYPTION_KEYS', { IDEMPOTENCY_ENCRYPTION_KEYS: `k1:${'*'.repeat(44)}` }],
    ['IDEMPOTENCY_ENCRYPTION_KEYS', { IDEMPOTENCY_ENCRYPTION_KEYS: `k1:${ENCRYPTION_KEY},k1:${ENCRYPTION_KEY}` }],
    ['IDEMPOTENCY_ENCRYPTION_KEYS', REAL_IN_PRODUCTION],
    ['PSP_API_KEY', { ...REAL_IN_PRODUCTION, IDEMPOTENCY_ENCRYPTION_KEYS: `k1:${ENCRYPTION_KEY}`, PSP_API_KEY: 'x'.repeat(32) }],
    ['EMBEDDED_PG_PORT', { EMBEDDED_PG_PORT: '1' }],
    ['EMBEDDED_PG_PORT', { EMBEDDED_PG_PORT: '70000' }],
  ];

  it.each(cases)('%s: %j', (variable, env) => {
    const err = configError(env);
    expect(err.variable).toBe(variable);
    expect(err.name).toBe('ConfigError');
    expect(err.message).toContain(variable);
  });

  it('covers every variable that has a value to validate', () => {
    // Only EMBEDDED_PG_DIR accepts any value (a folder name).
    expect(new Set(cases.map(([variable]) => variable))).toEqual(new Set(VARIABLES.filter((v) => v !== 'EMBEDDED_PG_DIR')));
  });

  it('accepts the bounds themselves', () => {
    expect(loadConfig({ PORT: '0' }).port).toBe(0);
    expect(loadConfig({ PORT: '65535' }).port).toBe(65535);
    expect(loadConfig({ IDEMPOTENCY_TTL_SECONDS: '1' }).idempotencyTtlSeconds).toBe(1);
    expect(loadConfig({ EMBEDDED_PG_PORT: '1024' }).embeddedPgPort).toBe(1024);
    const sixteenBytes = `whsec_${Buffer.alloc(16, 1).toString('base64')}`;
    expect(loadConfig({ PSP_WEBHOOK_SECRET: sixteenBytes }).pspWebhookSecret).toBe(sixteenBytes);
    expect(loadConfig({ PSP_MAX_ATTEMPTS: '3' }).pspMaxAttempts).toBe(3);
    expect(loadConfig({ RECONCILE_INTERVAL_MS: '100' }).reconcileIntervalMs).toBe(100);
    expect(loadConfig({ PSP_BREAKER_THRESHOLD: '1' }).pspBreakerThreshold).toBe(1);
  });
});

describe('loadConfig: IDEMPOTENCY_ENCRYPTION_KEYS', () => {
  it('reads id:base64 pairs, the first one current', () => {
    const other = Buffer.alloc(32, 3).toString('base64');
    expect(loadConfig({ IDEMPOTENCY_ENCRYPTION_KEYS: ` k2:${ENCRYPTION_KEY} , k1:${other}` }).idempotencyEncryption).toEqual({
      keys: { k2: Buffer.from(ENCRYPTION_KEY, 'base64'), k1: Buffer.from(other, 'base64') },
      current: 'k2',
    });
  });

  it('is required in production, optional (off) in development', () => {
    const err = configError({ ...REAL, NODE_ENV: 'production' });
    expect(err.message).toContain('IDEMPOTENCY_ENCRYPTION_KEYS is required when NODE_ENV=production');
    expect(loadConfig({ ...REAL_IN_PRODUCTION, IDEMPOTENCY_ENCRYPTION_KEYS: `k1:${ENCRYPTION_KEY}` }).idempotencyEncryption?.current).toBe(
      'k1',
    );
    expect(loadConfig({ ...REAL }).idempotencyEncryption).toBeUndefined();
  });

  it('names the key ids of a malformed value, never a key', () => {
    const short = Buffer.alloc(16, 5).toString('base64');
    const err = configError({ IDEMPOTENCY_ENCRYPTION_KEYS: `k2:${short},k1:${ENCRYPTION_KEY}` });
    expect(err.message).toContain('k2:***,k1:***');
    expect(err.message).not.toContain(short);
    expect(err.message).not.toContain(ENCRYPTION_KEY);
  });
});

describe('loadConfig: payments', () => {
  it('refuses a lease shorter than the retry budget (attempts × timeout + 2 s), naming the lease and the numbers', () => {
    // Defaults: 5 × 2000 + 2000 = 12000 ms.
    expect(loadConfig({ IDEMPOTENCY_LEASE_SECONDS: '12' }).idempotencyLeaseSeconds).toBe(12);
    const err = configError({ IDEMPOTENCY_LEASE_SECONDS: '11' });
    expect(err.variable).toBe('IDEMPOTENCY_LEASE_SECONDS');
    expect(err.message).toContain('at least 12');
    expect(err.message).toContain('PSP_MAX_ATTEMPTS 5');
    expect(err.message).toContain('PSP_TIMEOUT_MS 2000');
    // The budget follows both factors: 10 × 2000 + 2000 = 22000 ms; 4 × 3500 + 2000 = 16000 ms.
    expect(loadConfig({ PSP_MAX_ATTEMPTS: '10', IDEMPOTENCY_LEASE_SECONDS: '22' }).pspMaxAttempts).toBe(10);
    expect(configError({ PSP_MAX_ATTEMPTS: '4', PSP_TIMEOUT_MS: '3500', IDEMPOTENCY_LEASE_SECONDS: '15' }).message).toContain(
      'at least 16',
    );
    expect(loadConfig({ PSP_MAX_ATTEMPTS: '4', PSP_TIMEOUT_MS: '3500', IDEMPOTENCY_LEASE_SECONDS: '16' }).idempotencyLeaseSeconds).toBe(16);
    // A budget that is not a whole number of seconds rounds the minimum up: 3 × 1100 + 2000 = 5300 ms → 6 s.
    expect(configError({ PSP_MAX_ATTEMPTS: '3', PSP_TIMEOUT_MS: '1100', IDEMPOTENCY_LEASE_SECONDS: '5' }).message).toContain('at least 6');
    expect(loadConfig({ PSP_MAX_ATTEMPTS: '3', PSP_TIMEOUT_MS: '1100', IDEMPOTENCY_LEASE_SECONDS: '6' }).idempotencyLeaseSeconds).toBe(6);
  });

  it('PSP_WEBHOOK_URL: unset is the service itself, a URL is that URL, the word none is no delivery', () => {
    expect(loadConfig({}).pspWebhookDelivery).toEqual({ to: 'self' });
    expect(loadConfig({ PSP_WEBHOOK_URL: '' }).pspWebhookDelivery).toEqual({ to: 'self' });
    expect(loadConfig({ PSP_WEBHOOK_URL: 'none' }).pspWebhookDelivery).toEqual({ to: 'none' });
    expect(loadConfig({ PSP_WEBHOOK_URL: 'https://shop.example.com/webhooks/psp' }).pspWebhookDelivery).toEqual({
      to: 'url',
      url: 'https://shop.example.com/webhooks/psp',
    });
    expect(configError({ PSP_WEBHOOK_URL: 'nowhere' }).message).toContain('or the word none');
  });

  it('PSP_WEBHOOK_DUPLICATES takes exactly true or false', () => {
    expect(loadConfig({ PSP_WEBHOOK_DUPLICATES: 'true' }).pspWebhookDuplicates).toBe(true);
    expect(loadConfig({ PSP_WEBHOOK_DUPLICATES: 'false' }).pspWebhookDuplicates).toBe(false);
  });

  it('RECONCILE_INTERVAL_MS=0 turns the reconciler off', () => {
    expect(loadConfig({ RECONCILE_INTERVAL_MS: '0' }).reconcileIntervalMs).toBe(0);
  });
});

describe('loadConfig: no published secret guards a real database', () => {
  it('the dev webhook secret is used only on the embedded database, and only when PSP_WEBHOOK_SECRET is unset', () => {
    const embedded = loadConfig({});
    expect(embedded.usingDevWebhookSecret).toBe(true);
    expect(embedded.pspWebhookSecret).toBe(DEV_WEBHOOK_SECRET);
    const own = loadConfig({ PSP_WEBHOOK_SECRET: WEBHOOK_SECRET });
    expect(own.usingDevWebhookSecret).toBe(false);
    expect(own.pspWebhookSecret).toBe(WEBHOOK_SECRET);
    const real = loadConfig(REAL);
    expect(real.usingDevWebhookSecret).toBe(false);
    expect(real.pspWebhookSecret).toBe(WEBHOOK_SECRET);
  });

  it('refuses a real database without PSP_WEBHOOK_SECRET, or with the published dev secret, as it does for API_KEYS', () => {
    expect(configError({ DATABASE_URL: PG_URL, API_KEYS: KEYS }).message).toContain(
      'PSP_WEBHOOK_SECRET is required when DATABASE_URL is set',
    );
    expect(configError({ ...REAL, PSP_WEBHOOK_SECRET: DEV_WEBHOOK_SECRET }).message).toContain('published dev secret');
    expect(configError({ ...REAL, API_KEYS: `demo:${DEV_API_CLIENT.secret}` }).message).toContain('published dev secret');
  });

  it('the dev webhook secret is itself a well-formed secret (the embedded run can verify signatures with it)', () => {
    expect(loadConfig({ PSP_WEBHOOK_SECRET: DEV_WEBHOOK_SECRET }).pspWebhookSecret).toBe(DEV_WEBHOOK_SECRET);
  });
});

describe("loadConfig: the provider's secret key (PSP_API_KEY)", () => {
  it('the published dev key only where the dev webhook secret is accepted: the embedded database, no NODE_ENV=production, no real provider', () => {
    expect(loadConfig({})).toMatchObject({ pspApiKey: DEV_PSP_API_KEY, usingDevPspApiKey: true, pspSandbox: 'in-process' });
    expect(loadConfig({ PSP_API_KEY: PSP_KEY })).toMatchObject({ pspApiKey: PSP_KEY, usingDevPspApiKey: false });
    expect(loadConfig(REAL)).toMatchObject({ pspApiKey: PSP_KEY, usingDevPspApiKey: false });
    for (const [deployed, env] of [
      ['DATABASE_URL is set', { ...REAL, PSP_BASE_URL: undefined, PSP_SANDBOX: 'in-process' }],
      ['PSP_BASE_URL names a real provider', { ...REAL, DATABASE_URL: undefined }],
      ['NODE_ENV=production', { ...REAL_IN_PRODUCTION, DATABASE_URL: undefined, IDEMPOTENCY_ENCRYPTION_KEYS: `k1:${ENCRYPTION_KEY}` }],
    ] as const) {
      const missing = configError({ ...env, PSP_API_KEY: undefined });
      expect(missing.variables).toEqual(['PSP_API_KEY']);
      expect(missing.message).toContain(`PSP_API_KEY is required when ${deployed}, and must not be the published dev key`);
      expect(configError({ ...env, PSP_API_KEY: DEV_PSP_API_KEY }).variables).toEqual(['PSP_API_KEY']);
    }
  });

  it('the dev key is itself a well-formed key, and production takes a generated one', () => {
    expect(loadConfig({ PSP_API_KEY: DEV_PSP_API_KEY }).pspApiKey).toBe(DEV_PSP_API_KEY);
    const production = { ...REAL_IN_PRODUCTION, IDEMPOTENCY_ENCRYPTION_KEYS: `k1:${ENCRYPTION_KEY}` };
    expect(loadConfig(production).pspApiKey).toBe(PSP_KEY);
    expect(configError({ ...production, PSP_API_KEY: 'x'.repeat(32) }).message).toContain(
      'PSP_API_KEY must be generated when NODE_ENV=production',
    );
  });
});

describe('loadConfig: a secret never appears in an error message', () => {
  const SECRET = 'Sup3rS3cretValue-XYZ-987';

  it.each<[what: string, secret: string, env: Env]>([
    ['a short API key', 'Sup3rS3cr', { API_KEYS: 'alice:Sup3rS3cr' }],
    ['an API key next to a malformed client id', SECRET, { API_KEYS: `al ice:${SECRET}` }],
    ['an API key next to a malformed entry', SECRET, { API_KEYS: `alice:${SECRET},bob` }],
    [
      'a hand-typed key in production',
      'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx',
      { ...REAL, NODE_ENV: 'production', API_KEYS: `alice:${'x'.repeat(30)}` },
    ],
    ['a duplicated secret', SECRET, { API_KEYS: `alice:${SECRET},bob:${SECRET}` }],
    ['an API key written with = instead of :', SECRET, { API_KEYS: `alice=${SECRET}` }],
    ['a short webhook secret', 'Sup3rS3cr', { PSP_WEBHOOK_SECRET: 'Sup3rS3cr' }],
    ['a malformed webhook secret', SECRET, { PSP_WEBHOOK_SECRET: `whsec_${SECRET}` }],
    ['the dev API key next to a real database', DEV_API_CLIENT.secret, { ...REAL, API_KEYS: `ops:${DEV_API_CLIENT.secret}` }],
    ['a provider key with a space in it', SECRET, { PSP_API_KEY: `${SECRET} ${SECRET}` }],
    ['a short provider key', 'Sup3rS3cr', { PSP_API_KEY: 'Sup3rS3cr' }],
    ['the dev provider key next to a real provider', DEV_PSP_API_KEY, { ...REAL, PSP_API_KEY: DEV_PSP_API_KEY }],
    ['a hand-typed provider key in production', 'x'.repeat(32), { ...REAL_IN_PRODUCTION, PSP_API_KEY: 'x'.repeat(32) }],
    ['the password in a DATABASE_URL of the wrong scheme', SECRET, { DATABASE_URL: `mysql://app:${SECRET}@db/orders`, API_KEYS: KEYS }],
    ['the password in an unparsable DATABASE_URL', SECRET, { DATABASE_URL: `postgres://app:${SECRET}@db:99999/orders`, API_KEYS: KEYS }],
    ['the password in a PSP_BASE_URL of the wrong scheme', SECRET, { PSP_BASE_URL: `ftp://psp:${SECRET}@psp.example.com` }],
  ])('%s', (_what, secret, env) => {
    const err = configError(env);
    expect(err.message).not.toContain(secret);
    expect(String(err)).not.toContain(secret);
    expect(JSON.stringify(err)).not.toContain(secret);
  });

  it('a valid key is not in the message of an error about another entry', () => {
    const err = configError({ API_KEYS: `alice:${SECRET},bob:short` });
    expect(err.message).toContain('API_KEYS');
    expect(err.message).not.toContain(SECRET);
  });
});

describe('loadConfig: DATABASE_PREPARED_STATEMENTS', () => {
  it('unset: on by default (undefined: nobody chose), true or false when set, nothing else', () => {
    expect(loadConfig(REAL).databasePreparedStatements).toBeUndefined();
    expect(loadConfig({ ...REAL, DATABASE_PREPARED_STATEMENTS: 'false' }).databasePreparedStatements).toBe(false);
    expect(loadConfig({ ...REAL, DATABASE_PREPARED_STATEMENTS: 'true' }).databasePreparedStatements).toBe(true);
    expect(configError({ ...REAL, DATABASE_PREPARED_STATEMENTS: 'off' }).variable).toBe('DATABASE_PREPARED_STATEMENTS');
  });

  it("unset with DATABASE_URL on PgBouncer's port 6432: refused, naming the variable; either choice is accepted", () => {
    const pooled = { ...REAL, DATABASE_URL: 'postgres://app:pw@pgbouncer:6432/orders' };
    const err = configError(pooled);
    expect(err.variable).toBe('DATABASE_PREPARED_STATEMENTS');
    expect(err.message).toContain('6432');
    expect(loadConfig({ ...pooled, DATABASE_PREPARED_STATEMENTS: 'false' }).databasePreparedStatements).toBe(false);
    expect(loadConfig({ ...pooled, DATABASE_PREPARED_STATEMENTS: 'true' }).databasePreparedStatements).toBe(true);
  });
});

describe('loadConfig: every problem at once', () => {
  it('names every bad variable in one error, one line each, in the order they are checked', () => {
    const err = configError({ PORT: 'eighty', LOG_LEVEL: 'loud', PSP_WEBHOOK_DUPLICATES: 'yes' });
    expect(err.variables).toEqual(['LOG_LEVEL', 'PORT', 'PSP_WEBHOOK_DUPLICATES']);
    expect(err.message.split('\n')).toEqual([
      'Invalid configuration (3 variables):',
      `  LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent (got "loud")`,
      '  PORT must be a whole number from 0 to 65535 (got "eighty")',
      '  PSP_WEBHOOK_DUPLICATES must be true or false (got "yes")',
    ]);
  });

  it('names everything a real database requires when all of it is missing, not one per start', () => {
    const err = configError({ DATABASE_URL: PG_URL });
    expect(err.variables).toEqual(['API_KEYS', 'PSP_WEBHOOK_SECRET', 'PSP_API_KEY', 'PSP_BASE_URL']);
    expect(err.message).toContain('PSP_API_KEY is required when DATABASE_URL is set');
    expect(err.message).toContain('PSP_BASE_URL is required when DATABASE_URL is set');
    expect(err.message).toContain('API_KEYS is required when DATABASE_URL is set');
    expect(err.message).toContain('PSP_WEBHOOK_SECRET is required when DATABASE_URL is set');
  });

  it('a single problem keeps its one-line message', () => {
    const err = configError({ PORT: 'eighty' });
    expect(err.variables).toEqual(['PORT']);
    expect(err.message).toBe('Invalid configuration: PORT must be a whole number from 0 to 65535 (got "eighty")');
  });

  it('does not add a lease problem computed from an invalid attempt count or timeout', () => {
    expect(configError({ PSP_MAX_ATTEMPTS: 'five', IDEMPOTENCY_LEASE_SECONDS: '5' }).variables).toEqual(['PSP_MAX_ATTEMPTS']);
    expect(configError({ PSP_TIMEOUT_MS: '0', IDEMPOTENCY_LEASE_SECONDS: '5' }).variables).toEqual(['PSP_TIMEOUT_MS']);
  });
});

describe('loadConfig: the order events relay', () => {
  it('AMQP_URL: an amqp(s) URL turns the relay on; anything else is refused by name, its password hidden', () => {
    expect(loadConfig({ AMQP_URL: 'amqp://guest:guest@localhost:5672' }).amqpUrls).toEqual(['amqp://guest:guest@localhost:5672']);
    expect(loadConfig({ AMQP_URL: 'amqps://u:p@mq.example.com' }).amqpUrls).toEqual(['amqps://u:p@mq.example.com']);
    const error = configError({ AMQP_URL: 'http://user:secret@mq.example.com' });
    expect(error.variable).toBe('AMQP_URL');
    expect(error.message).toContain('must use amqp: or amqps:');
    expect(error.message).not.toContain('secret');
  });

  it("AMQP_URL: a comma-separated list of a cluster's nodes, each one checked, the bad one named with its password hidden", () => {
    expect(loadConfig({ AMQP_URL: 'amqp://u:p@mq1:5672, amqp://u:p@mq2:5672,amqp://u:p@mq3:5672' }).amqpUrls).toEqual([
      'amqp://u:p@mq1:5672',
      'amqp://u:p@mq2:5672',
      'amqp://u:p@mq3:5672',
    ]);
    const error = configError({ AMQP_URL: 'amqp://u:p@mq1:5672,http://u:secret@mq2:5672' });
    expect(error.variable).toBe('AMQP_URL');
    expect(error.message).toContain('must use amqp: or amqps:');
    expect(error.message).toContain('mq2');
    expect(error.message).not.toContain('secret');
    expect(configError({ AMQP_URL: 'amqp://u:p@mq1:5672,,amqp://u:p@mq3:5672' }).variable).toBe('AMQP_URL');
  });

  it('ORDER_EVENTS_LEASE_MS must outlast a publish confirm (at least 6000); the fault hook takes one word', () => {
    expect(loadConfig({ ORDER_EVENTS_LEASE_MS: '6000' }).orderEventsLeaseMs).toBe(6_000);
    expect(configError({ ORDER_EVENTS_LEASE_MS: '5000' }).variable).toBe('ORDER_EVENTS_LEASE_MS');
    expect(loadConfig({ ORDER_EVENTS_RELAY_FAULT: 'die-after-confirm' }).orderEventsRelayFault).toBe('die-after-confirm');
    expect(configError({ ORDER_EVENTS_RELAY_FAULT: 'yes' }).variable).toBe('ORDER_EVENTS_RELAY_FAULT');
  });
});
