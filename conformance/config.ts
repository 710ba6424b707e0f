import { exec } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { promisify } from 'node:util';
import { loopbackBase } from './http.js';

const sh = promisify(exec);

/** Two callers: the checks send as `a`; `b` is the other client of the cross-caller check. */
export type Caller = 'a' | 'b';

/** The kit's input, as a JSON file (`--config`) or flags; conformance/README.md describes every field. */
export interface KitConfig {
  base: string;
  operation: {
    method: string;
    path: string;
    /** A valid JSON body. The string `{{unique}}` anywhere in it is replaced by a fresh value per key. */
    body: unknown;
    /** A valid body that is another request (for the 422 check); derived from `{{unique}}` when absent. */
    otherBody?: unknown;
    /** A body the API refuses as invalid (400); `{}` when absent. */
    invalidBody?: unknown;
  };
  /** Headers (credentials) of each caller. */
  callers: Record<Caller, Record<string, string>>;
  effects?: {
    /** A GET that lists what the caller created: `path`, the array at `items` (dotted; the body itself if absent), pages through `next` → `?cursorParam=`. */
    list?: { path: string; items?: string; next?: string; cursorParam?: string };
    /** A shell command that prints how many effects the caller has (`{caller}` is replaced by a or b; also in CONFORMANCE_CALLER). */
    command?: string;
    /** What names an effect in an answer: `location` (default, when the answer has one) or `body:<dotted field>`. */
    id?: string;
  };
  /** The header that marks a replay; found by itself when absent (a header only the replay has, named like replay or idempotent). */
  replayHeader?: string;
  /** The OpenAPI document's path on the base (JSON), for the expiry-policy check. */
  openapi?: string;
  /** A request that provokes a 5xx: a body and/or headers, and optionally shell commands run before and after it. */
  serverError?: { body?: unknown; headers?: Record<string, string>; arm?: string; disarm?: string };
  /** Shell commands: `kill` stops the API abruptly; `start` starts it again at the same base (the kit waits until it answers). */
  crash?: { kill: string; start: string; keys?: number };
  /** How many identical requests the parallel check fires at once (and the bound on requests in flight): 10, at most 32. */
  parallel?: number;
  timeoutMs?: number;
  /** Run only these checks (ids). */
  only?: string[];
}

/** What the checks act through: config made into functions, so a test can pass its own (kill a child it started, arm a trigger). */
export interface Target {
  base: URL;
  operation: KitConfig['operation'];
  callers: KitConfig['callers'];
  replayHeader?: string;
  openapi?: string;
  parallel: number;
  timeoutMs: number;
  only?: string[];
  effectId: string | undefined;
  countEffects?: (caller: Caller) => Promise<number>;
  serverError?: { body?: unknown; headers?: Record<string, string>; arm?: () => Promise<void>; disarm?: () => Promise<void> };
  crash?: { kill: () => Promise<void>; start: () => Promise<void>; keys: number };
}

export const MAX_PARALLEL = 32;

export class ConfigError extends Error {}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function stringRecord(value: unknown, what: string): Record<string, string> {
  if (!isRecord(value) || !Object.values(value).every((v) => typeof v === 'string')) throw new ConfigError(`${what} must be an object of header names to string values`);
  return value as Record<string, string>;
}

/** Checks the shape of a config (from a file, flags, or a test) and fills in defaults. */
export function validateConfig(raw: unknown): KitConfig {
  if (!isRecord(raw)) throw new ConfigError('the config must be a JSON object');
  const { base, operation, callers } = raw;
  if (typeof base !== 'string') throw new ConfigError('base is required (--base http://127.0.0.1:3000)');
  try {
    loopbackBase(base);
  } catch (err) {
    throw new ConfigError((err as Error).message);
  }
  if (!isRecord(operation) || typeof operation.method !== 'string' || typeof operation.path !== 'string' || operation.body === undefined) {
    throw new ConfigError('operation needs method, path and body (--method POST --path /orders --body \'{…}\')');
  }
  if (!operation.path.startsWith('/')) throw new ConfigError(`operation.path ${operation.path} must start with /`);
  if (!isRecord(callers)) throw new ConfigError('callers.a and callers.b are required (--caller-a "Authorization: Bearer …" --caller-b …)');
  const parallel = raw.parallel === undefined ? 10 : raw.parallel;
  if (typeof parallel !== 'number' || !Number.isInteger(parallel) || parallel < 2 || parallel > MAX_PARALLEL) throw new ConfigError(`parallel must be an integer from 2 to ${MAX_PARALLEL}`);
  const config: KitConfig = {
    ...(raw as unknown as KitConfig),
    operation: { ...(operation as unknown as KitConfig['operation']), method: operation.method.toUpperCase() },
    callers: { a: stringRecord(callers.a, 'callers.a'), b: stringRecord(callers.b, 'callers.b') },
    parallel,
  };
  const effects = config.effects;
  if (effects?.list && typeof effects.list.path !== 'string') throw new ConfigError('effects.list.path must be a path');
  if (effects?.id && effects.id !== 'location' && !effects.id.startsWith('body:')) throw new ConfigError('effects.id is location or body:<field>');
  if (config.openapi !== undefined && (typeof config.openapi !== 'string' || !config.openapi.startsWith('/'))) throw new ConfigError('openapi is the document\'s path on the base, e.g. /docs-json');
  if (config.crash && (typeof config.crash.kill !== 'string' || typeof config.crash.start !== 'string')) throw new ConfigError('crash needs kill and start commands');
  return config;
}

const FLAG_HELP = `npm run conformance -- --base URL --method POST --path /orders --body '{…}' --caller-a 'Authorization: Bearer A' --caller-b 'Authorization: Bearer B' [options]
  --config FILE           the same as JSON (flags override it); see conformance/README.md
  --other-body JSON       another valid body (the 422 check); else derived from {{unique}} in --body
  --invalid-body JSON     a body the API refuses (400); else {}
  --count-list PATH       a GET listing the caller's effects (array at --count-items, pages via --count-next/--count-cursor)
  --count-command CMD     a shell command printing the caller's count ({caller} → a|b)
  --effect-id location|body:FIELD   what names an effect in an answer
  --replay-header NAME    the replay marker (found by itself if absent)
  --openapi PATH          the OpenAPI document's path on the base (JSON)
  --kill-command CMD --start-command CMD   the crash check
  --parallel N            identical requests at once (10; at most ${MAX_PARALLEL})
  --only id,id            run only these checks
  --json                  one JSON document on stdout (for CI)`;

export const USAGE = FLAG_HELP;

function header(line: string, flag: string): [string, string] {
  const at = line.indexOf(':');
  if (at <= 0) throw new ConfigError(`${flag} takes "Name: value", got ${line}`);
  return [line.slice(0, at).trim(), line.slice(at + 1).trim()];
}

function json(text: string, flag: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw new ConfigError(`${flag} is not JSON: ${text}`);
  }
}

/** Flags on top of an optional --config file. Returns the config and whether --json was asked for. */
export function parseArgs(argv: string[]): { config: KitConfig; json: boolean } {
  let file: Record<string, unknown> = {};
  const flags = new Map<string, string[]>();
  let wantJson = false;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--json') {
      wantJson = true;
      continue;
    }
    if (!arg.startsWith('--') || i + 1 >= argv.length) throw new ConfigError(`unexpected argument ${arg}\n${FLAG_HELP}`);
    flags.set(arg, [...(flags.get(arg) ?? []), argv[++i]]);
  }
  const last = (flag: string) => flags.get(flag)?.at(-1);
  const configFile = last('--config');
  if (configFile) {
    const parsed = json(readFileSync(configFile, 'utf8'), `--config ${configFile}`);
    if (!isRecord(parsed)) throw new ConfigError(`--config ${configFile} must hold a JSON object`);
    file = parsed;
  }
  const operation = { ...(isRecord(file.operation) ? file.operation : {}) };
  if (last('--method')) operation.method = last('--method');
  if (last('--path')) operation.path = last('--path');
  if (last('--body')) operation.body = json(last('--body')!, '--body');
  if (last('--other-body')) operation.otherBody = json(last('--other-body')!, '--other-body');
  if (last('--invalid-body')) operation.invalidBody = json(last('--invalid-body')!, '--invalid-body');
  const fileCallers = isRecord(file.callers) ? file.callers : {};
  const callers: Record<string, unknown> = { ...fileCallers };
  for (const who of ['a', 'b'] as const) {
    const lines = flags.get(`--caller-${who}`);
    if (lines) callers[who] = Object.fromEntries(lines.map((l) => header(l, `--caller-${who}`)));
  }
  const effects: Record<string, unknown> = { ...(isRecord(file.effects) ? file.effects : {}) };
  if (last('--count-list')) effects.list = { path: last('--count-list'), items: last('--count-items'), next: last('--count-next'), cursorParam: last('--count-cursor') };
  if (last('--count-command')) effects.command = last('--count-command');
  if (last('--effect-id')) effects.id = last('--effect-id');
  const crash = isRecord(file.crash) ? { ...file.crash } : {};
  if (last('--kill-command')) crash.kill = last('--kill-command');
  if (last('--start-command')) crash.start = last('--start-command');
  const merged: Record<string, unknown> = { ...file, operation, callers };
  if (Object.keys(effects).length > 0) merged.effects = effects;
  if (Object.keys(crash).length > 0) merged.crash = crash;
  if (last('--base')) merged.base = last('--base');
  if (last('--replay-header')) merged.replayHeader = last('--replay-header');
  if (last('--openapi')) merged.openapi = last('--openapi');
  if (last('--parallel')) merged.parallel = Number(last('--parallel'));
  if (last('--timeout-ms')) merged.timeoutMs = Number(last('--timeout-ms'));
  if (last('--only')) merged.only = last('--only')!.split(',');
  return { config: validateConfig(merged), json: wantJson };
}

/** Runs a shell command to completion; its output is returned, a non-zero exit is an error naming the command. */
async function run(command: string, env: Record<string, string> = {}): Promise<string> {
  try {
    const { stdout } = await sh(command, { env: { ...process.env, ...env }, timeout: 120_000 });
    return stdout;
  } catch (err) {
    const e = err as { code?: number; stderr?: string };
    throw new Error(`command failed (exit ${e.code}): ${command}\n${e.stderr ?? ''}`.trim(), { cause: err });
  }
}

function dotted(value: unknown, path: string | undefined): unknown {
  if (!path) return value;
  return path.split('.').reduce<unknown>((at, part) => (isRecord(at) ? at[part] : undefined), value);
}

/**
 * Counts effects through the list GET: every page, by the caller. A page cursor the list repeats,
 * or more than 200 pages, is an error rather than a wrong count.
 */
function listCounter(config: KitConfig, base: URL, timeoutMs: number): (caller: Caller) => Promise<number> {
  const list = config.effects!.list!;
  return async (caller) => {
    let total = 0;
    let url = new URL(list.path, base);
    const seen = new Set<string>();
    for (let page = 0; page < 200; page++) {
      const res = await fetch(url, { headers: config.callers[caller], signal: AbortSignal.timeout(timeoutMs) });
      const text = await res.text();
      if (res.status !== 200) throw new Error(`counting effects: GET ${url.pathname}${url.search} answered ${res.status}: ${text.slice(0, 200)}`);
      const body = JSON.parse(text) as unknown;
      const items = dotted(body, list.items ?? (Array.isArray(body) ? undefined : 'items'));
      if (!Array.isArray(items)) throw new Error(`counting effects: GET ${url.pathname} has no array at ${list.items ?? 'items'}`);
      total += items.length;
      const next = list.next ? dotted(body, list.next) : undefined;
      if (typeof next !== 'string' || next === '') return total;
      if (seen.has(next)) throw new Error(`counting effects: GET ${list.path} gave the cursor ${next} twice`);
      seen.add(next);
      url = new URL(list.path, base);
      url.searchParams.set(list.cursorParam ?? 'cursor', next);
    }
    throw new Error(`counting effects: GET ${list.path} has more than 200 pages`);
  };
}

function commandCounter(command: string): (caller: Caller) => Promise<number> {
  return async (caller) => {
    const out = (await run(command.replaceAll('{caller}', caller), { CONFORMANCE_CALLER: caller })).trim();
    if (!/^\d+$/.test(out)) throw new Error(`counting effects: ${command} printed ${JSON.stringify(out.slice(0, 100))}, not a count`);
    return Number(out);
  };
}

/** Polls the base URL until anything answers over HTTP (a restarted API is up), or fails past the deadline. */
export async function waitUntilAnswering(base: URL, deadlineMs = 60_000): Promise<void> {
  const deadline = Date.now() + deadlineMs;
  for (;;) {
    try {
      await fetch(base, { signal: AbortSignal.timeout(2_000) }).then((r) => r.arrayBuffer());
      return;
    } catch {
      if (Date.now() > deadline) throw new Error(`${base.href} did not answer within ${deadlineMs / 1000} s of the start command`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

/** The config's commands as functions; `overrides` replaces any of them (a test's own kill and start). */
export function resolveTarget(config: KitConfig, overrides: Partial<Pick<Target, 'countEffects' | 'serverError' | 'crash'>> = {}): Target {
  const base = loopbackBase(config.base);
  const timeoutMs = config.timeoutMs ?? 30_000;
  const effects = config.effects;
  const countEffects = effects?.list ? listCounter(config, base, timeoutMs) : effects?.command ? commandCounter(effects.command) : undefined;
  const se = config.serverError;
  const crash = config.crash;
  return {
    base,
    operation: config.operation,
    callers: config.callers,
    replayHeader: config.replayHeader,
    openapi: config.openapi,
    parallel: config.parallel ?? 10,
    timeoutMs,
    only: config.only,
    effectId: effects?.id,
    countEffects: overrides.countEffects ?? countEffects,
    serverError:
      overrides.serverError ??
      (se && {
        body: se.body,
        headers: se.headers,
        arm: se.arm ? async () => void (await run(se.arm!)) : undefined,
        disarm: se.disarm ? async () => void (await run(se.disarm!)) : undefined,
      }),
    crash:
      overrides.crash ??
      (crash && {
        keys: crash.keys ?? 24,
        kill: async () => void (await run(crash.kill)),
        start: async () => {
          await run(crash.start);
          await waitUntilAnswering(base);
        },
      }),
  };
}
