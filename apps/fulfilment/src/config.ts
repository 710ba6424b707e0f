import type { LogLevel } from '@nestjs/common';
import { randomBytes } from 'node:crypto';
import {
  BEARER_SECRET_FORMAT,
  listenHost,
  LOG_LEVEL_NAMES,
  type LogLevelName,
  looksHandTyped,
  MIN_DISTINCT_CHARACTERS,
  MIN_PRODUCTION_SECRET_LENGTH,
  NEST_LOG_LEVELS,
} from '#service-kit';

/**
 * The fulfilment consumer's configuration, read and validated once at start-up: every bad or missing variable is
 * named at once, and nothing has a default that would fail open.
 */
export interface FulfilmentConfig {
  /** The PostgreSQL database this app migrates (its own `fulfilment` schema) and writes. */
  databaseUrl: string;
  /** The RabbitMQ broker the order service publishes its events to: one URL, or a cluster's nodes (AMQP_URL comma-separated). */
  amqpUrls: string[];
  /** HTTP: GET /health, GET /shipments/{orderId}, GET /metrics. */
  port: number;
  /** HOST: the address to listen on. Default: 127.0.0.1 in development, 0.0.0.0 in production (as the order service). */
  host: string;
  /** FULFILMENT_API_TOKEN: the bearer token every HTTP route but GET /health requires (shipments name clients and totals). */
  apiToken: string;
  /** True when FULFILMENT_API_TOKEN was unset and this start made its own (development only; the banner prints it). */
  apiTokenGenerated: boolean;
  /** Deliveries unacked at once on this consumer's channel (its concurrency and its share of a redelivery). */
  prefetch: number;
  /** Deliveries of a failing message before it is dead-lettered. */
  maxAttempts: number;
  /** How long a dedupe mark is kept (see docs/patterns/message-consumer.md#how-long-the-mark-lives). */
  markRetentionHours: number;
  /** Group commit: most deliveries per transaction (1 = one transaction per message) and how long a batch gathers. */
  batchSize: number;
  batchWaitMs: number;
  databasePoolSize: number;
  /** Tests only: `die-after-batch-commit` SIGKILLs the process between a batch's COMMIT and its acks. */
  fault?: 'die-after-batch-commit';
  /** What Nest's logger writes (LOG_LEVEL, pino's names as the service takes them). */
  logLevels: LogLevel[];
}

export class FulfilmentConfigError extends Error {}

/** Every variable the consumer reads (`.env.example` lists them in its fulfilment section; a test holds the two together). */
export const FULFILMENT_VARIABLES = [
  'NODE_ENV',
  'DATABASE_URL',
  'AMQP_URL',
  'PORT',
  'HOST',
  'FULFILMENT_API_TOKEN',
  'FULFILMENT_PREFETCH',
  'FULFILMENT_MAX_ATTEMPTS',
  'FULFILMENT_MARK_RETENTION_HOURS',
  'FULFILMENT_BATCH_SIZE',
  'FULFILMENT_BATCH_WAIT_MS',
  'DATABASE_POOL_SIZE',
  'LOG_LEVEL',
  'FULFILMENT_FAULT',
] as const;

type Env = Record<string, string | undefined>;

function integer(env: Env, name: string, fallback: number, min: number, max: number, problems: string[]): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!/^\d+$/.test(raw) || value < min || value > max) {
    problems.push(`${name} must be an integer from ${min} to ${max}, got "${raw}"`);
    return fallback;
  }
  return value;
}

function url(env: Env, name: string, protocols: string[], example: string, problems: string[]): string {
  const raw = env[name];
  if (!raw) {
    problems.push(`${name} must be set (e.g. ${example})`);
    return '';
  }
  let parsed: URL;
  try {
    parsed = new URL(raw);
  } catch {
    problems.push(`${name} is not a URL`);
    return '';
  }
  if (!protocols.includes(parsed.protocol)) problems.push(`${name} must be a ${protocols.join(' or ')} URL, got ${parsed.protocol}`);
  return raw;
}

/** A comma-separated list of URLs (a cluster's nodes), each checked as `url` checks one; a bad entry is named by its place. */
function urlList(env: Env, name: string, protocols: string[], example: string, problems: string[]): string[] {
  const raw = env[name];
  if (!raw) return [url(env, name, protocols, example, problems)];
  const entries = raw.split(',').map((part) => part.trim());
  if (entries.length === 1) return [url(env, name, protocols, example, problems)];
  return entries.map((entry, i) => {
    const own: string[] = [];
    const checked = url({ [name]: entry }, name, protocols, example, own);
    problems.push(...own.map((problem) => `${problem} (its entry ${i + 1})`));
    return checked;
  });
}

function logLevels(env: Env, problems: string[]): LogLevel[] {
  const raw = env.LOG_LEVEL;
  if (raw === undefined || raw === '') return NEST_LOG_LEVELS.info;
  if (!(LOG_LEVEL_NAMES as readonly string[]).includes(raw)) {
    problems.push(`LOG_LEVEL must be one of ${LOG_LEVEL_NAMES.join(', ')}, got "${raw}"`);
    return NEST_LOG_LEVELS.info;
  }
  // `debug`: a line per applied and duplicate message.
  return NEST_LOG_LEVELS[raw as LogLevelName];
}

function fault(env: Env, problems: string[]): FulfilmentConfig['fault'] {
  const raw = env.FULFILMENT_FAULT;
  if (raw === undefined || raw === '') return undefined;
  if (raw !== 'die-after-batch-commit')
    problems.push(`FULFILMENT_FAULT must be die-after-batch-commit (tests only) or unset, got "${raw}"`);
  return raw === 'die-after-batch-commit' ? raw : undefined;
}

/**
 * NODE_ENV=production: FULFILMENT_API_TOKEN required and generated, HOST every interface by default. Only the usual
 * three words, as the order service reads it: "prod" must not quietly mean development.
 */
function productionMode(env: Env, problems: string[]): boolean {
  const raw = env.NODE_ENV?.trim();
  if (!raw) return false;
  if (!['production', 'development', 'test'].includes(raw))
    problems.push(`NODE_ENV must be production, development or test (or unset: development), got "${raw}"`);
  return raw === 'production';
}

function listenAddress(env: Env, production: boolean, problems: string[]): string {
  const { host, problem } = listenHost(env.HOST, production);
  if (problem) problems.push(`HOST ${problem}, got "${env.HOST?.trim()}"`);
  return host;
}

const GENERATE = 'e.g. openssl rand -hex 16';

/**
 * FULFILMENT_API_TOKEN, never printed when refused. Unset in development: a random token made at each start and
 * printed in the banner. Not a published dev token like the order service's dev API key: that rule refuses it whenever
 * DATABASE_URL is set, and this consumer always has one, so it could never be used. Required in production: a token
 * that changes at each restart would lock out the scraper, and production logs are no place for a secret.
 */
function apiToken(env: Env, production: boolean, problems: string[]): Pick<FulfilmentConfig, 'apiToken' | 'apiTokenGenerated'> {
  const raw = env.FULFILMENT_API_TOKEN?.trim();
  if (!raw) {
    if (production) problems.push(`FULFILMENT_API_TOKEN must be set when NODE_ENV=production (${GENERATE})`);
    // 24 random bytes: 32 characters, well past the production floor the token would have to meet.
    return { apiToken: randomBytes(24).toString('base64url'), apiTokenGenerated: true };
  }
  if (!BEARER_SECRET_FORMAT.test(raw)) {
    problems.push(`FULFILMENT_API_TOKEN must be 16 to 512 visible ASCII characters, no spaces (${GENERATE})`);
  } else if (production && looksHandTyped(raw)) {
    problems.push(
      `FULFILMENT_API_TOKEN must be generated when NODE_ENV=production: ${MIN_PRODUCTION_SECRET_LENGTH} or more characters, ` +
        `${MIN_DISTINCT_CHARACTERS} or more of them different (${GENERATE})`,
    );
  }
  return { apiToken: raw, apiTokenGenerated: false };
}

export function loadFulfilmentConfig(env: Env = process.env): FulfilmentConfig {
  const problems: string[] = [];
  const production = productionMode(env, problems);
  const config: FulfilmentConfig = {
    databaseUrl: url(env, 'DATABASE_URL', ['postgres:', 'postgresql:'], 'postgres://user:password@localhost:5432/orders', problems),
    amqpUrls: urlList(env, 'AMQP_URL', ['amqp:', 'amqps:'], 'amqp://guest:guest@127.0.0.1:5672', problems),
    port: integer(env, 'PORT', 3002, 0, 65_535, problems),
    host: listenAddress(env, production, problems),
    ...apiToken(env, production, problems),
    prefetch: integer(env, 'FULFILMENT_PREFETCH', 20, 1, 1_000, problems),
    // At most the queue's fixed delivery limit (broker.ts), which must stay the backstop behind it.
    maxAttempts: integer(env, 'FULFILMENT_MAX_ATTEMPTS', 5, 1, 20, problems),
    // Seven days by default: longer than anything can redeliver or republish an event (the reasoning is in the doc).
    markRetentionHours: integer(env, 'FULFILMENT_MARK_RETENTION_HOURS', 168, 1, 24 * 365, problems),
    // 10 of the 20 in flight: one batch gathers while the one before it commits. At most 50 (the layer's cap).
    batchSize: integer(env, 'FULFILMENT_BATCH_SIZE', 10, 1, 50, problems),
    batchWaitMs: integer(env, 'FULFILMENT_BATCH_WAIT_MS', 5, 0, 1_000, problems),
    databasePoolSize: integer(env, 'DATABASE_POOL_SIZE', 10, 1, 500, problems),
    logLevels: logLevels(env, problems),
    fault: fault(env, problems),
  };
  if (problems.length) throw new FulfilmentConfigError(`Invalid configuration: ${problems.join('; ')}`);
  return config;
}
