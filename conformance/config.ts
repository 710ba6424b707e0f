import { exec } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { resolve as resolvePath } from 'node:path';
import { promisify } from 'node:util';
import { CHECKS } from './checks.js';
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
    /**
     * A GET that lists what the caller created: `path`, the array at `items` (dotted; the body itself if absent), pages through `next` →
     * `?cursorParam=`.
     */
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
  /**
   * How to make one request wait inside its handler after its effect is written, before the key is recorded (or the
   * transaction commits): headers and/or a body, and optionally commands run before and after. The request says it
   * got there with a 1xx (102), or the kit sees its effect counted. Makes the kill and the races land in that window.
   */
  hold?: { headers?: Record<string, string>; body?: unknown; arm?: string; disarm?: string };
  /**
   * Shell commands: `kill` stops the API abruptly; `start` starts it again at the same base (the kit waits until it
   * answers). `retryWindowMs`: how long a key is retried after the restart (a 409's Retry-After beyond it extends it).
   */
  crash?: { kill: string; start: string; keys?: number; retryWindowMs?: number };
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
  hold?: { headers?: Record<string, string>; body?: unknown; arm?: () => Promise<void>; disarm?: () => Promise<void> };
  crash?: { kill: () => Promise<void>; start: () => Promise<void>; keys: number; retryWindowMs: number };
}

export const MAX_PARALLEL = 32;
export const DEFAULT_RETRY_WINDOW_MS = 30_000;

export class ConfigError extends Error {}

export const unknownChecks = (ids: string[]) =>
  `unknown check id in only: ${ids.join(', ')} (known: ${CHECKS.map((c) => c.id).join(', ')})`;

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * The config's shape, for validation: every key the kit reads, and its type. A misspelt key (`crsh`) or a wrong
 * type is an error naming it, never a check silently n/a. Hand-written: the kit has no runtime dependency.
 */
type Shape =
  'string' | 'json' | 'headers' | 'strings' | { integer: [number, number] } | { object: Record<string, Shape>; required?: string[] };
const obj = (fields: Record<string, Shape>, required: string[] = []): Shape => ({ object: fields, required });
const HOOK = obj({ body: 'json', headers: 'headers', arm: 'string', disarm: 'string' });
const CONFIG_SHAPE = obj(
  {
    base: 'string',
    operation: obj({ method: 'string', path: 'string', body: 'json', otherBody: 'json', invalidBody: 'json' }, ['method', 'path', 'body']),
    callers: obj({ a: 'headers', b: 'headers' }, ['a', 'b']),
    effects: obj({
      list: obj({ path: 'string', items: 'string', next: 'string', cursorParam: 'string' }, ['path']),
      command: 'string',
      id: 'string',
    }),
    replayHeader: 'string',
    openapi: 'string',
    serverError: HOOK,
    hold: HOOK,
    crash: obj({ kill: 'string', start: 'string', keys: { integer: [1, 1000] }, retryWindowMs: { integer: [0, 3_600_000] } }, [
      'kill',
      'start',
    ]),
    parallel: { integer: [2, MAX_PARALLEL] },
    timeoutMs: { integer: [1, 3_600_000] },
    only: 'strings',
    $schema: 'string',
  },
  ['base', 'operation', 'callers'],
);

function checkShape(value: unknown, shape: Shape, at: string): void {
  const where = at || 'the config';
  if (shape === 'json') return;
  if (shape === 'string') {
    if (typeof value !== 'string') throw new ConfigError(`${where} must be a string, got ${JSON.stringify(value)}`);
  } else if (shape === 'strings') {
    if (!Array.isArray(value) || !value.every((v) => typeof v === 'string')) throw new ConfigError(`${where} must be an array of strings`);
  } else if (shape === 'headers') {
    if (!isRecord(value) || !Object.values(value).every((v) => typeof v === 'string'))
      throw new ConfigError(`${where} must be an object of header names to string values`);
  } else if ('integer' in shape) {
    const [min, max] = shape.integer;
    if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max)
      throw new ConfigError(`${where} must be an integer from ${min} to ${max}, got ${JSON.stringify(value)}`);
  } else {
    if (!isRecord(value)) throw new ConfigError(`${where} must be an object`);
    for (const key of Object.keys(value)) {
      if (!(key in shape.object))
        throw new ConfigError(
          `unknown key ${at ? `${at}.` : ''}${key} (known${at ? ` in ${at}` : ''}: ${Object.keys(shape.object)
            .filter((k) => k !== '$schema')
            .join(', ')})`,
        );
    }
    for (const key of shape.required ?? []) if (value[key] === undefined) throw new ConfigError(`${at ? `${at}.` : ''}${key} is required`);
    for (const [key, field] of Object.entries(shape.object))
      if (value[key] !== undefined) checkShape(value[key], field, at ? `${at}.${key}` : key);
  }
}

/** Checks the shape of a config (from a file, flags, or a test) and fills in defaults. */
export function validateConfig(raw: unknown): KitConfig {
  if (!isRecord(raw)) throw new ConfigError('the config must be a JSON object');
  if (raw.base === undefined) throw new ConfigError('base is required (--base http://127.0.0.1:3000)');
  if (
    !isRecord(raw.operation) ||
    raw.operation.method === undefined ||
    raw.operation.path === undefined ||
    raw.operation.body === undefined
  ) {
    throw new ConfigError("operation needs method, path and body (--method POST --path /orders --body '{…}')");
  }
  if (!isRecord(raw.callers) || raw.callers.a === undefined || raw.callers.b === undefined) {
    throw new ConfigError('callers.a and callers.b are required (--caller-a "Authorization: Bearer …" --caller-b …)');
  }
  checkShape(raw, CONFIG_SHAPE, '');
  const config = raw as unknown as KitConfig;
  try {
    loopbackBase(config.base);
  } catch (err) {
    throw new ConfigError((err as Error).message);
  }
  if (!config.operation.path.startsWith('/')) throw new ConfigError(`operation.path ${config.operation.path} must start with /`);
  const effects = config.effects;
  if (effects?.id && effects.id !== 'location' && !effects.id.startsWith('body:'))
    throw new ConfigError('effects.id is location or body:<field>');
  if (config.openapi !== undefined && !config.openapi.startsWith('/'))
    throw new ConfigError("openapi is the document's path on the base, e.g. /docs-json");
  if (config.hold && config.hold.headers === undefined && config.hold.body === undefined && config.hold.arm === undefined) {
    throw new ConfigError('hold needs headers, a body or an arm command: what makes the request wait after its effect');
  }
  const unknown = (config.only ?? []).filter((id) => !CHECKS.some((c) => c.id === id));
  if (unknown.length > 0) throw new ConfigError(unknownChecks(unknown));
  return { ...config, operation: { ...config.operation, method: config.operation.method.toUpperCase() }, parallel: config.parallel ?? 10 };
}

const FLAG_HELP = `npx idempotency-key-conformance --base URL --method POST --path /orders --body '{…}' --caller-a 'Authorization: Bearer A' --caller-b 'Authorization: Bearer B' [options]
  --config FILE             the same as JSON (flags override it; relative to the directory you ran from): README.md
  --base URL                the API's base URL, on loopback (http://127.0.0.1:3000)
  --method M --path P       the write operation (POST /orders)
  --body JSON               a valid body; {{unique}} in a string becomes a fresh value per key
  --other-body JSON         another valid body (the 422 check); else derived from {{unique}} in --body
  --invalid-body JSON       a body the API refuses (400); else {}
  --caller-a 'Name: value'  a header of caller a (repeat for more); --caller-b likewise for the other caller
  --count-list PATH         a GET listing the caller's effects; the array at --count-items FIELD (dotted),
                            pages via --count-next FIELD (the next cursor) and --count-cursor PARAM (its query parameter)
  --count-command CMD       a shell command printing the caller's count ({caller} → a|b)
  --effect-id location|body:FIELD   what names an effect in an answer
  --replay-header NAME      the replay marker (found by itself if absent)
  --openapi PATH            the OpenAPI document's path on the base (JSON)
  --hold-header 'Name: value'   makes a request wait after its effect is written (repeat for more): the crash checks, the
                            races; it must end with the API's process (CHECKS.md, "The hold")
  --kill-command CMD --start-command CMD   the crash checks (start must return once started: detach the app's output)
  --keys N                  keys sent across crash-one-effect's kill (24)
  --retry-window-ms MS      how long the crash checks retry a key after the restart (${DEFAULT_RETRY_WINDOW_MS}; a longer Retry-After extends it)
  --parallel N              identical requests at once (10; 2 to ${MAX_PARALLEL})
  --timeout-ms MS           per-request timeout (30000)
  --only id,id              run only these checks
  --json                    one JSON document on stdout (for CI)
  --help                    this
What each check sends, expects and catches: CHECKS.md; the config: README.md (both in this package, and on its npm page).
Exit 0: no check failed; 1: a check failed; 2: the run is broken (the config, an API that is not answering, a hold
it ignores, a kill that did not kill: the part to fix is named); 3: inconclusive, nothing failed but a check could
not provoke what it tests (nothing in flight at the kill).`;

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

function integer(text: string, flag: string): number {
  if (!/^\d+$/.test(text)) throw new ConfigError(`${flag} takes a whole number, got ${text}`);
  return Number(text);
}

const FLAGS = new Set([
  '--config',
  '--base',
  '--method',
  '--path',
  '--body',
  '--other-body',
  '--invalid-body',
  '--caller-a',
  '--caller-b',
  '--count-list',
  '--count-items',
  '--count-next',
  '--count-cursor',
  '--count-command',
  '--effect-id',
  '--replay-header',
  '--openapi',
  '--hold-header',
  '--kill-command',
  '--start-command',
  '--keys',
  '--retry-window-ms',
  '--parallel',
  '--timeout-ms',
  '--only',
]);

/**
 * Flags on top of an optional --config file. Returns the config and whether --json was asked for. A relative
 * --config is read from `cwd`: the directory the user ran from (INIT_CWD under `npm run`, which moves to the package).
 */
export function parseArgs(argv: string[], cwd = process.env.INIT_CWD || process.cwd()): { config: KitConfig; json: boolean } {
  let file: Record<string, unknown> = {};
  const flags = new Map<string, string[]>();
  let wantJson = false;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--json') {
      wantJson = true;
      continue;
    }
    if (!FLAGS.has(arg)) throw new ConfigError(`unknown argument ${arg} (--help lists the options)`);
    if (i + 1 >= argv.length) throw new ConfigError(`${arg} needs a value`);
    flags.set(arg, [...(flags.get(arg) ?? []), argv[++i]]);
  }
  const last = (flag: string) => flags.get(flag)?.at(-1);
  const configFile = last('--config');
  if (configFile) {
    const path = resolvePath(cwd, configFile);
    let text: string;
    try {
      text = readFileSync(path, 'utf8');
    } catch (err) {
      throw new ConfigError(
        `--config ${configFile}: cannot read ${path} (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`,
      );
    }
    const parsed = json(text, `--config ${configFile}`);
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
  if (last('--count-list')) {
    const list: Record<string, unknown> = { path: last('--count-list') };
    for (const [flag, field] of [
      ['--count-items', 'items'],
      ['--count-next', 'next'],
      ['--count-cursor', 'cursorParam'],
    ])
      if (last(flag)) list[field] = last(flag);
    effects.list = list;
  }
  if (last('--count-command')) effects.command = last('--count-command');
  if (last('--effect-id')) effects.id = last('--effect-id');
  const crash = isRecord(file.crash) ? { ...file.crash } : {};
  if (last('--kill-command')) crash.kill = last('--kill-command');
  if (last('--start-command')) crash.start = last('--start-command');
  if (last('--keys')) crash.keys = integer(last('--keys')!, '--keys');
  if (last('--retry-window-ms')) crash.retryWindowMs = integer(last('--retry-window-ms')!, '--retry-window-ms');
  const merged: Record<string, unknown> = { ...file, operation, callers };
  if (Object.keys(effects).length > 0) merged.effects = effects;
  if (Object.keys(crash).length > 0) merged.crash = crash;
  const holdLines = flags.get('--hold-header');
  if (holdLines)
    merged.hold = {
      ...(isRecord(file.hold) ? file.hold : {}),
      headers: Object.fromEntries(holdLines.map((l) => header(l, '--hold-header'))),
    };
  if (last('--base')) merged.base = last('--base');
  if (last('--replay-header')) merged.replayHeader = last('--replay-header');
  if (last('--openapi')) merged.openapi = last('--openapi');
  if (last('--parallel')) merged.parallel = integer(last('--parallel')!, '--parallel');
  if (last('--timeout-ms')) merged.timeoutMs = integer(last('--timeout-ms')!, '--timeout-ms');
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
      if (res.status !== 200)
        throw new Error(`counting effects: GET ${url.pathname}${url.search} answered ${res.status}: ${text.slice(0, 200)}`);
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
export function resolveTarget(
  config: KitConfig,
  overrides: Partial<Pick<Target, 'countEffects' | 'serverError' | 'hold' | 'crash'>> = {},
): Target {
  const base = loopbackBase(config.base);
  const timeoutMs = config.timeoutMs ?? 30_000;
  const effects = config.effects;
  const countEffects = effects?.list
    ? listCounter(config, base, timeoutMs)
    : effects?.command
      ? commandCounter(effects.command)
      : undefined;
  const se = config.serverError;
  const crash = config.crash;
  const hold = config.hold;
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
    hold:
      overrides.hold ??
      (hold && {
        body: hold.body,
        headers: hold.headers,
        arm: hold.arm ? async () => void (await run(hold.arm!)) : undefined,
        disarm: hold.disarm ? async () => void (await run(hold.disarm!)) : undefined,
      }),
    crash:
      overrides.crash ??
      (crash && {
        keys: crash.keys ?? 24,
        retryWindowMs: crash.retryWindowMs ?? DEFAULT_RETRY_WINDOW_MS,
        kill: async () => void (await run(crash.kill)),
        start: async () => {
          await run(crash.start);
          await waitUntilAnswering(base);
        },
      }),
  };
}
