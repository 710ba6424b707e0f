import { BEARER_SECRET_FORMAT, ConfigError, type EmbeddedDatabaseSettings } from '#service-kit';
import type { SandboxWebhookDelivery } from './sandbox-options.js';

/**
 * `npm run psp`'s configuration: only what the sandbox alone reads, validated once, every bad variable named at once.
 * Hand-written like the service's (src/config): a handful of variables, and @nestjs/config would add a second way.
 */
export interface SandboxConfig extends EmbeddedDatabaseSettings {
  port: number;
  timeoutMs: number;
  webhookDelivery: SandboxWebhookDelivery;
  webhookSecret: string;
  webhookDuplicates: boolean;
  /** PSP_API_KEY: the secret key every request must carry. */
  apiKey: string;
  /** True when PSP_API_KEY was not given and the published dev key is in use (its own embedded database only). */
  usingDevApiKey: boolean;
}

type Env = Record<string, string | undefined>;

/** The sandbox's webhook secret when none is given (the service's dev default): published, so refused with DATABASE_URL. */
export const DEV_WEBHOOK_SECRET = 'whsec_ZGV2LW9ubHktd2ViaG9vay1zZWNyZXQtY2hhbmdlISE=';

/** The provider key when none is given (the service's dev default): published, so refused with DATABASE_URL. */
export const DEV_PSP_API_KEY = 'sk_test_dev-only-psp-key-change-me';

export function loadSandboxConfig(env: Env = process.env): SandboxConfig {
  const problems: ConfigError[] = [];
  const invalid = <T>(name: string, problem: string, raw: string, fallback: T): T => {
    problems.push(new ConfigError(name, problem, raw));
    return fallback;
  };
  const integer = (name: string, fallback: number, min: number, max: number): number => {
    const raw = env[name];
    if (raw === undefined || raw === '') return fallback;
    if (!/^\d+$/.test(raw.trim()) || Number(raw) < min || Number(raw) > max)
      return invalid(name, `must be a whole number from ${min} to ${max}`, raw, fallback);
    return Number(raw);
  };

  let databaseUrl = env.DATABASE_URL || undefined;
  if (databaseUrl !== undefined) {
    let protocol = '';
    try {
      protocol = new URL(databaseUrl).protocol;
    } catch {
      // Not a URL: refused below.
    }
    // Never printed: it may carry a password.
    if (protocol !== 'postgres:' && protocol !== 'postgresql:')
      databaseUrl = invalid('DATABASE_URL', 'must be a postgres:// URL', '***', undefined);
  }

  const rawDelivery = env.PSP_WEBHOOK_URL;
  let webhookDelivery: SandboxWebhookDelivery = { to: 'none' };
  // Alone, there is no "self" to deliver to: unset means no delivery, said at start-up; events wait in the outbox.
  if (rawDelivery !== undefined && rawDelivery !== '' && rawDelivery !== 'none') {
    let web = false;
    try {
      web = ['http:', 'https:'].includes(new URL(rawDelivery).protocol);
    } catch {
      // Not a URL: refused below.
    }
    webhookDelivery = web
      ? { to: 'url', url: rawDelivery }
      : invalid('PSP_WEBHOOK_URL', 'must be an http(s) URL or the word none', rawDelivery, webhookDelivery);
  }

  const rawSecret = env.PSP_WEBHOOK_SECRET?.trim() || undefined;
  let webhookSecret = rawSecret ?? DEV_WEBHOOK_SECRET;
  const encoded = webhookSecret.startsWith('whsec_') ? webhookSecret.slice('whsec_'.length) : webhookSecret;
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(encoded) || encoded.length % 4 !== 0 || Buffer.from(encoded, 'base64').length < 16) {
    // The value is never printed: even a malformed secret may be a real one with a typo.
    webhookSecret = invalid('PSP_WEBHOOK_SECRET', 'must be whsec_ followed by the base64 of at least 16 bytes', '***', DEV_WEBHOOK_SECRET);
  } else if (databaseUrl && webhookSecret === DEV_WEBHOOK_SECRET) {
    // On a real database, events signed with the published secret could be forged by anyone.
    invalid(
      'PSP_WEBHOOK_SECRET',
      'is required when DATABASE_URL is set, and must not be the published dev secret',
      rawSecret ? '***' : '',
      undefined,
    );
  }

  const rawKey = env.PSP_API_KEY?.trim() || undefined;
  let apiKey = rawKey ?? DEV_PSP_API_KEY;
  if (!BEARER_SECRET_FORMAT.test(apiKey)) {
    // Never printed: a malformed key may be the real one with a typo.
    apiKey = invalid('PSP_API_KEY', 'must be 16 to 512 visible characters without spaces', '***', DEV_PSP_API_KEY);
  } else if (databaseUrl && apiKey === DEV_PSP_API_KEY) {
    // Beside a real database, a published key would let anyone charge, or fail, whatever payment they name.
    invalid('PSP_API_KEY', 'is required when DATABASE_URL is set, and must not be the published dev key', rawKey ? '***' : '', undefined);
  }

  const rawDuplicates = env.PSP_WEBHOOK_DUPLICATES;
  let webhookDuplicates = false;
  if (rawDuplicates !== undefined && rawDuplicates !== '') {
    if (rawDuplicates === 'true' || rawDuplicates === 'false') webhookDuplicates = rawDuplicates === 'true';
    else invalid('PSP_WEBHOOK_DUPLICATES', 'must be true or false', rawDuplicates, undefined);
  }

  const config: SandboxConfig = {
    port: integer('PSP_PORT', 4000, 0, 65535),
    databaseUrl,
    // Not the service's embedded server (.data/postgres on 54329): both may run at once, each on a folder of its own.
    embeddedPgDir: env.EMBEDDED_PG_DIR || '.data/psp-postgres',
    embeddedPgPort: integer('EMBEDDED_PG_PORT', 54339, 1024, 65535),
    // The client's per-attempt timeout, as the service reads it: the slow test tokens' delays are multiples of it.
    timeoutMs: integer('PSP_TIMEOUT_MS', 2_000, 1, 60_000),
    webhookDelivery,
    webhookSecret,
    webhookDuplicates,
    apiKey,
    usingDevApiKey: !rawKey,
  };
  if (problems.length) throw ConfigError.of(problems);
  return config;
}
