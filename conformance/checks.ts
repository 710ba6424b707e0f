import { randomUUID } from 'node:crypto';
import type { Caller, Target } from './config.js';
import { type Answer, type Exchange, HttpClient, jsonOf } from './http.js';

/** `choice`: the API departs from the draft's or Stripe's default on purpose and consistently: reported, not a failure. */
export type Outcome = 'pass' | 'fail' | 'n/a' | 'choice';

export interface CheckResult {
  id: string;
  title: string;
  outcome: Outcome;
  /** One line: why it passed, what went wrong, or why it does not apply. */
  detail: string;
  /** What the check could not verify (no effect counter, no ids in answers). */
  notes: string[];
  /** On a failure: the requests that show it and what came back. */
  evidence: Exchange[];
}

export interface Check {
  id: string;
  title: string;
  run(ctx: CheckContext): Promise<Verdict>;
}

type Verdict = { outcome: Outcome; detail: string; evidence?: Exchange[] };

const UNIQUE = '{{unique}}';
const IDEMPOTENCY_KEY = 'Idempotency-Key';

/** A failure raised anywhere in a check, with the exchanges that show it. */
class Failure extends Error {
  constructor(
    message: string,
    readonly evidence: Exchange[] = [],
  ) {
    super(message);
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const is2xx = (a: Answer | undefined) => a !== undefined && a.status >= 200 && a.status < 300;
const statusOf = (x: Exchange) => (x.answer ? String(x.answer.status) : `no answer (${x.error})`);

function histogram(xs: Exchange[], marker: (a: Answer) => boolean): string {
  const counts = new Map<string, number>();
  for (const x of xs) {
    const label = x.answer ? `${x.answer.status}${marker(x.answer) ? ' replayed' : ''}` : `no answer (${x.error})`;
    counts.set(label, (counts.get(label) ?? 0) + 1);
  }
  return [...counts].map(([label, n]) => `${n}× ${label}`).join(', ');
}

/** The body with every `{{unique}}` replaced by `token`. */
function withToken(value: unknown, token: string): unknown {
  if (typeof value === 'string') return value.replaceAll(UNIQUE, token);
  if (Array.isArray(value)) return value.map((v) => withToken(v, token));
  if (typeof value === 'object' && value !== null)
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, withToken(v, token)]));
  return value;
}

const hasToken = (value: unknown): boolean => JSON.stringify(value).includes(UNIQUE);

/** The same JSON value with every object's members in reverse order. */
function reordered(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(reordered);
  if (typeof value === 'object' && value !== null)
    return Object.fromEntries(
      Object.entries(value)
        .reverse()
        .map(([k, v]) => [k, reordered(v)]),
    );
  return value;
}

/** The helpers every check shares: sending the operation, counting effects, telling replays apart. */
export class CheckContext {
  readonly notes: string[] = [];
  private replayHeaderSeen: string | undefined;

  constructor(
    readonly target: Target,
    readonly http: HttpClient,
  ) {}

  newKey(): string {
    return `conformance-${randomUUID()}`;
  }

  /** A valid body for a new request: its own `{{unique}}` value, if the body has the placeholder. */
  bodyFor(token: string): unknown {
    return withToken(this.target.operation.body, token);
  }

  /** Sends the operation. `key`: one value, several header lines, or none; `bodyText` as given (to control key order and spaces). */
  send(
    options: {
      key?: string | string[];
      caller?: Caller;
      body?: unknown;
      bodyText?: string;
      headers?: Record<string, string>;
      onInformation?: (status: number) => void;
    } = {},
  ): Promise<Exchange> {
    const headers: Record<string, string | string[]> = {
      'Content-Type': 'application/json',
      ...this.target.callers[options.caller ?? 'a'],
      ...options.headers,
    };
    if (options.key !== undefined) headers[IDEMPOTENCY_KEY] = options.key;
    const body = options.bodyText ?? JSON.stringify(options.body ?? this.bodyFor(randomUUID()));
    return this.http.send({ method: this.target.operation.method, path: this.target.operation.path, headers, body }, options.onInformation);
  }

  /** The body a held request sends: the hold's own (with a fresh `{{unique}}`), or the operation's. */
  heldBody(token: string): unknown {
    const hold = this.target.hold;
    return hold?.body !== undefined ? withToken(hold.body, token) : this.bodyFor(token);
  }

  /**
   * Sends a request that the target holds inside its handler after its effect is written (`hold`), and resolves
   * once it is there: it answered a 1xx, or its effect is counted. Fails if it answered or timed out first: then
   * the hold does not hold, and nothing the kit does next would land in the window.
   */
  async sendHeld(key: string, body: unknown, before: number | undefined): Promise<{ exchange: Promise<Exchange>; signal: string }> {
    const hold = this.target.hold!;
    await hold.arm?.();
    let signal!: (how: string) => void;
    const reached = new Promise<string>((resolve) => (signal = resolve));
    const exchange = this.send({ key, body, headers: hold.headers, onInformation: (status) => signal(`answered ${status} when held`) });
    void exchange.then((x) => signal(x.answer ? `final:answered ${x.answer.status}` : `final:got no answer (${x.error})`));
    let polling = before !== undefined;
    const poll = async () => {
      while (polling) {
        if ((await this.count()) !== before) return signal('its effect counted while held');
        await sleep(100);
      }
    };
    void poll().catch((err: Error) => signal(`final:could not be followed: the effect counter failed (${err.message})`));
    const how = await reached;
    polling = false;
    if (how.startsWith('final:')) {
      const x = await exchange;
      await hold.disarm?.();
      throw new Failure(
        `the held request ${how.slice(6)} before a 1xx or its effect counted: hold does not make it wait after its effect`,
        [x],
      );
    }
    return { exchange, signal: how };
  }

  /** How many effects `caller` has, or undefined without a counter (noted once per check). */
  async count(caller: Caller = 'a'): Promise<number | undefined> {
    if (!this.target.countEffects) {
      this.note('effects not counted (no effects.list or effects.command): "one effect" and "nothing executed" are unverified');
      return undefined;
    }
    return this.target.countEffects(caller);
  }

  /** Fails unless `caller` gained exactly `expected` effects since `before`. */
  async expectEffects(
    before: number | undefined,
    expected: number,
    what: string,
    evidence: Exchange[],
    caller: Caller = 'a',
  ): Promise<string> {
    if (before === undefined) return '';
    const after = (await this.count(caller))!;
    if (after - before !== expected) throw new Failure(`${what}: ${after - before} effect(s), expected ${expected}`, evidence);
    return `; ${after - before} effect(s)`;
  }

  note(text: string): void {
    if (!this.notes.includes(text)) this.notes.push(text);
  }

  /** The effect an answer names: its Location, or a body field (effects.id). */
  effectOf(answer: Answer | undefined): string | undefined {
    if (!answer) return undefined;
    const id = this.target.effectId;
    if (id === undefined || id === 'location') return answer.headers.location;
    const value = id
      .slice('body:'.length)
      .split('.')
      .reduce<unknown>(
        (at, part) => (typeof at === 'object' && at !== null ? (at as Record<string, unknown>)[part] : undefined),
        jsonOf(answer),
      );
    return typeof value === 'string' || typeof value === 'number' ? String(value) : undefined;
  }

  /** True when the answer carries the replay marker (the configured header, or the one found by `expectReplay`). */
  isReplay(answer: Answer): boolean {
    const name = (this.target.replayHeader ?? this.replayHeaderSeen)?.toLowerCase();
    if (name) return answer.headers[name] !== undefined && answer.headers[name] !== 'false';
    return Object.entries(answer.headers).some(([n, v]) => /replay/i.test(n) && v !== 'false');
  }

  /**
   * The marker header on `replay`: the configured one, or one found earlier in this check, else a header only
   * the replay has, named like replay or idempotent (or, when `first` was itself a replay, one named like replay).
   */
  replayMarker(first: Answer, replay: Answer): string | undefined {
    const known = this.target.replayHeader ?? this.replayHeaderSeen;
    const present = (name: string) => replay.headers[name.toLowerCase()] !== undefined && replay.headers[name.toLowerCase()] !== 'false';
    if (known) return present(known) ? known : undefined;
    const names = Object.keys(replay.headers);
    const name =
      names.find((n) => /replay|idempot/i.test(n) && first.headers[n] === undefined) ?? names.find((n) => /replay/i.test(n) && present(n));
    if (name) this.replayHeaderSeen = name;
    return name;
  }

  /** Fails unless `again` is `first` replayed: same status, same bytes, the marker. Returns the marker's name. */
  expectReplay(first: Exchange, again: Exchange, what: string): string {
    const a = first.answer!;
    const b = again.answer;
    if (!b) throw new Failure(`${what}: no answer (${again.error})`, [first, again]);
    if (b.status !== a.status) throw new Failure(`${what}: ${b.status}, not the first answer's ${a.status}`, [first, again]);
    if (!b.body.equals(a.body)) throw new Failure(`${what}: the body differs from the first answer's`, [first, again]);
    // The headers a client acts on, when the first answer carries them: the effect's address and its version.
    for (const name of ['location', 'etag']) {
      if (a.headers[name] !== undefined && a.headers[name] !== b.headers[name]) {
        throw new Failure(
          `${what}: ${name === 'etag' ? 'ETag' : 'Location'} ${b.headers[name] ?? '(none)'}, not the first answer's ${a.headers[name]}`,
          [first, again],
        );
      }
    }
    const marker = this.replayMarker(a, b);
    if (!marker)
      throw new Failure(
        `${what}: same status and bytes, but no header marks it as a replay${this.target.replayHeader ? ` (${this.target.replayHeader})` : ''}`,
        [first, again],
      );
    return `${marker}: ${b.headers[marker.toLowerCase()]}`;
  }
}

/** Sends a first request under a fresh key, failing the check unless it succeeds. */
async function firstRequest(ctx: CheckContext, key: string, body: unknown, caller: Caller = 'a'): Promise<Exchange> {
  const first = await ctx.send({ key, body, caller });
  if (!is2xx(first.answer))
    throw new Failure(`the first request with a fresh key answered ${statusOf(first)}, not 2xx: fix the operation's body or credentials`, [
      first,
    ]);
  return first;
}

function expectStatus(x: Exchange, status: number, what: string): void {
  if (x.answer?.status !== status) throw new Failure(`${what}: ${statusOf(x)}, expected ${status}`, [x]);
}

const PROBLEM_JSON = /^application\/problem\+json\b/i;

const missingKey: Check = {
  id: 'missing-key',
  title: 'no Idempotency-Key → 400, nothing executed (the media type reported apart)',
  async run(ctx) {
    const before = await ctx.count();
    const x = await ctx.send();
    expectStatus(x, 400, 'without a key');
    const type = x.answer!.headers['content-type'] ?? '';
    // Often the host app's exception filter, not the idempotency layer, picks the media type: a note, not the verdict.
    if (!PROBLEM_JSON.test(type))
      ctx.note(`the 400 is ${type || 'without a Content-Type'}, not application/problem+json (the draft's examples are problem documents)`);
    const effects = await ctx.expectEffects(before, 0, 'without a key', [x]);
    return { outcome: 'pass', detail: `400 ${type}${effects}` };
  },
};

function malformed(id: string, title: string, key: () => string | string[]): Check {
  return {
    id,
    title,
    async run(ctx) {
      const before = await ctx.count();
      const x = await ctx.send({ key: key() });
      expectStatus(x, 400, title);
      const effects = await ctx.expectEffects(before, 0, title, [x]);
      return { outcome: 'pass', detail: `400${effects}` };
    },
  };
}

/** A 256-character key, unique per run: its first 255 characters shared with `sibling`. */
const longKey = (prefix: string, last: string) => `${prefix}${'k'.repeat(255 - prefix.length)}${last}`;

const tooLongKey: Check = {
  id: 'malformed-key-too-long',
  title: 'a 256-character key → 400; a longer limit is a choice if keys are kept whole and bounded',
  async run(ctx) {
    const before = await ctx.count();
    const prefix = ctx.newKey();
    const x = await ctx.send({ key: longKey(prefix, 'a') });
    if (!is2xx(x.answer)) {
      expectStatus(x, 400, 'a 256-character key');
      return { outcome: 'pass', detail: `400${await ctx.expectEffects(before, 0, 'a 256-character key', [x])}` };
    }
    // Accepted: a limit above 255 is the API's to choose, unless the key is truncated (two keys collide) or unbounded.
    const sibling = await ctx.send({ key: longKey(prefix, 'b') });
    if (!is2xx(sibling.answer) || ctx.isReplay(sibling.answer!)) {
      throw new Failure(
        `two 256-character keys that differ in their last character: the second ${statusOf(sibling)}${is2xx(sibling.answer) ? ' replayed' : ''} (the key is truncated)`,
        [x, sibling],
      );
    }
    const huge = await ctx.send({ key: `${ctx.newKey()}${'k'.repeat(4096)}` });
    if (is2xx(huge.answer))
      throw new Failure(
        `a key of ${huge.sent.headers[IDEMPOTENCY_KEY].length} characters is accepted too: no limit, one request can fill a row`,
        [huge],
      );
    const effects = await ctx.expectEffects(before, 2, 'two 256-character keys', [x, sibling]);
    return {
      outcome: 'choice',
      detail: `accepts 256-character keys, kept whole (its limit is above this service's and Stripe's 255), refuses ${statusOf(huge)} at 4 kB${effects}`,
    };
  },
};

const malformedKeys: Check[] = [
  tooLongKey,
  malformed('malformed-key-empty', 'an empty key → 400', () => ''),
  malformed('malformed-key-commas', 'a bare key with commas (key,with,commas) → 400', () => `key,with,commas-${randomUUID()}`),
  malformed('malformed-key-two-headers', 'two Idempotency-Key headers → 400', () => [
    `conformance-${randomUUID()}`,
    `conformance-${randomUUID()}`,
  ]),
];

const retryReplays: Check = {
  id: 'retry-replays',
  title: 'a retry → the first status, byte-identical body, a replay marker; one effect',
  async run(ctx) {
    const before = await ctx.count();
    const key = ctx.newKey();
    const body = ctx.bodyFor(randomUUID());
    const first = await firstRequest(ctx, key, body);
    const again = await ctx.send({ key, body });
    const marker = ctx.expectReplay(first, again, 'the retry');
    const effects = await ctx.expectEffects(before, 1, 'a request and its retry', [first, again]);
    return { outcome: 'pass', detail: `${first.answer!.status} twice, same bytes, ${marker}${effects}` };
  },
};

const anotherBody: Check = {
  id: 'another-body-422',
  title: 'the same key with another body → 422, nothing executed',
  async run(ctx) {
    const { operation } = ctx.target;
    if (operation.otherBody === undefined && !hasToken(operation.body)) {
      return { outcome: 'n/a', detail: 'needs another valid body: operation.otherBody, or {{unique}} in the body' };
    }
    const key = ctx.newKey();
    const first = await firstRequest(ctx, key, ctx.bodyFor(randomUUID()));
    const before = await ctx.count();
    const other = await ctx.send({ key, body: operation.otherBody ?? ctx.bodyFor(randomUUID()) });
    expectStatus(other, 422, 'the same key with another body');
    const effects = await ctx.expectEffects(before, 0, 'the same key with another body', [first, other]);
    return { outcome: 'pass', detail: `422${effects}` };
  },
};

const parallel: Check = {
  id: 'parallel-one-effect',
  title: 'N parallel identical requests → one effect; every answer the replay or 409 + Retry-After',
  async run(ctx) {
    const n = ctx.target.parallel;
    const before = await ctx.count();
    const key = ctx.newKey();
    let all: Exchange[];
    let overlap = '';
    let body: unknown;
    if (ctx.target.hold) {
      // Made to overlap: the first is held inside its handler, after its effect, while the others arrive.
      body = ctx.heldBody(randomUUID());
      const held = await ctx.sendHeld(key, body, before);
      const others = Array.from({ length: n - 1 }, () => ctx.send({ key, body }));
      const first = await held.exchange;
      await ctx.target.hold.disarm?.();
      all = [first, ...(await Promise.all(others))];
      overlap = `; the others sent while the first was held (${held.signal})`;
    } else {
      ctx.note('the requests overlap by chance only: configure hold to make them overlap every time');
      body = ctx.bodyFor(randomUUID());
      all = await Promise.all(Array.from({ length: n }, () => ctx.send({ key, body })));
    }
    const statuses = histogram(all, (a) => ctx.isReplay(a));
    const ok = all.filter((x) => is2xx(x.answer));
    if (ok.length === 0) throw new Failure(`${n} parallel requests, none succeeded: ${statuses}`, all.slice(0, 2));
    const strays = all.filter((x) => !is2xx(x.answer) && !(x.answer?.status === 409 && x.answer.headers['retry-after'] !== undefined));
    if (strays.length > 0) {
      const what = strays[0].answer?.status === 409 ? '409 without Retry-After' : statusOf(strays[0]);
      throw new Failure(`${n} parallel requests: ${statuses}; ${strays.length} neither the replay nor 409 + Retry-After (e.g. ${what})`, [
        ok[0],
        strays[0],
      ]);
    }
    const differing = ok.find((x) => x.answer!.status !== ok[0].answer!.status || !x.answer!.body.equals(ok[0].answer!.body));
    if (differing) throw new Failure(`${n} parallel requests: ${statuses}; two successes differ (two executions?)`, [ok[0], differing]);
    const after = await ctx.send({ key, body });
    ctx.expectReplay(ok[0], after, 'a retry after the burst');
    const effects = await ctx.expectEffects(before, 1, `${n} parallel requests with one key`, [ok[0], after]);
    return { outcome: 'pass', detail: `${statuses}${effects}${overlap}` };
  },
};

const otherCaller: Check = {
  id: 'other-caller-own-effect',
  title: "the same key from another caller → its own effect, never the first caller's answer",
  async run(ctx) {
    const key = ctx.newKey();
    const body = ctx.bodyFor(randomUUID());
    const [beforeA, beforeB] = [await ctx.count('a'), await ctx.count('b')];
    const a = await firstRequest(ctx, key, body, 'a');
    const b = await ctx.send({ key, body, caller: 'b' });
    if (!is2xx(b.answer)) throw new Failure(`caller b, same key and body: ${statusOf(b)}, not 2xx (its own first request)`, [a, b]);
    const [idA, idB] = [ctx.effectOf(a.answer), ctx.effectOf(b.answer)];
    if (ctx.isReplay(b.answer!)) throw new Failure("caller b got a replay: caller a's answer", [a, b]);
    if (idA !== undefined && idA === idB) throw new Failure(`caller b got caller a's effect (${idA})`, [a, b]);
    if (idA === undefined && b.answer!.body.equals(a.answer!.body))
      throw new Failure('caller b got the same bytes as caller a (and the answers name no effect to tell them apart)', [a, b]);
    const effectsA = await ctx.expectEffects(beforeA, 1, 'caller a', [a, b], 'a');
    const effectsB = await ctx.expectEffects(beforeB, 1, 'caller b, same key', [a, b], 'b');
    return {
      outcome: 'pass',
      detail: `a: ${a.answer!.status}, b: ${b.answer!.status}, not a replay${idB ? `, its own ${idB}` : ''}${effectsA && `; a${effectsA.slice(1)}, b${effectsB.slice(1)}`}`,
    };
  },
};

const reorderedJson: Check = {
  id: 'reordered-json-replays',
  title: 'the same body with members reordered and other spacing → a replay, not a 422',
  async run(ctx) {
    const key = ctx.newKey();
    const body = ctx.bodyFor(randomUUID());
    const first = await firstRequest(ctx, key, body);
    const variant = JSON.stringify(reordered(body), null, 2);
    if (JSON.stringify(reordered(body)) === JSON.stringify(body))
      ctx.note('the body has no object with two members: only the spacing changed');
    const again = await ctx.send({ key, bodyText: variant });
    const marker = ctx.expectReplay(first, again, 'the reordered body');
    return { outcome: 'pass', detail: `replayed (${marker})` };
  },
};

const validationKeepsKey: Check = {
  id: 'validation-error-keeps-key',
  title: 'a validation error (400) does not burn the key: the fixed request runs',
  async run(ctx) {
    const key = ctx.newKey();
    const invalid = ctx.target.operation.invalidBody ?? {};
    const before = await ctx.count();
    const refused = await ctx.send({ key, body: invalid });
    if (is2xx(refused.answer))
      return {
        outcome: 'n/a',
        detail: `the invalid body ${JSON.stringify(invalid)} was accepted (${refused.answer!.status}): give operation.invalidBody`,
      };
    if (refused.answer?.status !== 400 && refused.answer?.status !== 422)
      throw new Failure(`the invalid body: ${statusOf(refused)}, expected 400`, [refused]);
    const fixed = await ctx.send({ key, body: ctx.bodyFor(randomUUID()) });
    if (!is2xx(fixed.answer) && fixed.answer?.status === 422) {
      // Stored on purpose, if the same invalid request replays its refusal: then a client fixes it under a new key.
      const same = await ctx.send({ key, body: invalid });
      const stored =
        same.answer?.status === refused.answer.status && same.answer.body.equals(refused.answer.body) && ctx.isReplay(same.answer);
      if (stored) {
        const effects = await ctx.expectEffects(before, 0, 'an invalid request, then another body under its key', [refused, fixed, same]);
        return {
          outcome: 'choice',
          detail: `stores its ${refused.answer.status}: the same request replays it, a fixed body under the key is a 422 (a new key is needed)${effects}`,
        };
      }
    }
    if (!is2xx(fixed.answer))
      throw new Failure(
        `after a ${refused.answer.status}, the valid request with the same key: ${statusOf(fixed)}, not 2xx: the refusal was stored`,
        [refused, fixed],
      );
    if (ctx.isReplay(fixed.answer!))
      throw new Failure('after a refusal, the valid request with the same key was answered as a replay', [refused, fixed]);
    const effects = await ctx.expectEffects(before, 1, 'an invalid then a valid request', [refused, fixed]);
    return { outcome: 'pass', detail: `${refused.answer.status}, then ${fixed.answer!.status} executed${effects}` };
  },
};

const serverErrorNotStored: Check = {
  id: 'server-error-not-stored',
  title: 'a 5xx is not stored: the retry runs',
  async run(ctx) {
    const provoke = ctx.target.serverError;
    if (!provoke) return { outcome: 'n/a', detail: 'no way to provoke a 5xx configured (serverError)' };
    const key = ctx.newKey();
    const body = provoke.body ?? ctx.bodyFor(randomUUID());
    await provoke.arm?.();
    let failed: Exchange;
    try {
      failed = await ctx.send({ key, body, headers: provoke.headers });
    } finally {
      await provoke.disarm?.();
    }
    if (!failed.answer || failed.answer.status < 500) throw new Failure(`serverError did not provoke a 5xx: ${statusOf(failed)}`, [failed]);
    const before = await ctx.count();
    // Disarmed, the same request must now run; without a disarm the plain body is retried (a stored 5xx would be replayed, or a 422).
    const retried = await ctx.send({ key, body: provoke.disarm ? body : ctx.bodyFor(randomUUID()) });
    if (!is2xx(retried.answer) || ctx.isReplay(retried.answer!))
      throw new Failure(`after a ${failed.answer.status}, the retry with the same key: ${statusOf(retried)}, not a fresh 2xx`, [
        failed,
        retried,
      ]);
    const effects = await ctx.expectEffects(before, 1, 'the retry after a 5xx', [failed, retried]);
    return { outcome: 'pass', detail: `${failed.answer.status}, then ${retried.answer!.status} executed${effects}` };
  },
};

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);

/** The OpenAPI path template (`/orders/{id}`) that names a concrete path. */
function pathItemFor(paths: Json, concrete: string): Json | undefined {
  const path = concrete.split('?')[0].replace(/\/$/, '') || '/';
  for (const [template, item] of Object.entries(paths)) {
    const pattern = new RegExp(
      `^${template
        .replace(/\/$/, '')
        .replace(/[.*+?^$()|[\]\\]/g, '\\$&')
        .replace(/\\?\{[^}]+\\?\}/g, '[^/]+')}$`,
      'i',
    );
    if (pattern.test(path) && isObject(item)) return item;
  }
  return undefined;
}

function resolveRef(doc: Json, value: unknown): unknown {
  if (!isObject(value) || typeof value.$ref !== 'string' || !value.$ref.startsWith('#/')) return value;
  return value.$ref
    .slice(2)
    .split('/')
    .reduce<unknown>((at, part) => (isObject(at) ? at[part.replace(/~1/g, '/').replace(/~0/g, '~')] : undefined), doc);
}

/** A duration (24 h, 7 days, 86400 seconds, PT24H) said together with what expires. */
const DURATION = /\b\d+(\.\d+)?\s*(s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?|d|days?|weeks?)\b|\bP(\d+[DW])?(T\d+[HMS])?\b/i;
const EXPIRY_WORD = /expir|ttl|remembered|retained|kept|stored for|valid for|lifetime/i;

const openapiExpiry: Check = {
  id: 'openapi-expiry',
  title: "the key's expiry is published in the OpenAPI document",
  async run(ctx) {
    const { openapi, operation } = ctx.target;
    if (!openapi) return { outcome: 'n/a', detail: 'no OpenAPI document configured (openapi)' };
    const x = await ctx.http.send({ method: 'GET', path: openapi, headers: { Accept: 'application/json', ...ctx.target.callers.a } });
    const doc = jsonOf(x.answer);
    if (x.answer?.status !== 200 || !isObject(doc) || !isObject(doc.paths))
      throw new Failure(`GET ${openapi}: ${statusOf(x)}, not a JSON OpenAPI document`, [x]);
    const item = pathItemFor(doc.paths, operation.path);
    const op = item && resolveRef(doc, item[operation.method.toLowerCase()]);
    if (!isObject(op)) throw new Failure(`the document has no ${operation.method} for ${operation.path}`, []);
    const listed = (v: unknown): unknown[] => (Array.isArray(v) ? (v as unknown[]) : []);
    const params = [...listed(item!.parameters), ...listed(op.parameters)].map((p) => resolveRef(doc, p));
    const keyParam = params.find(
      (p): p is Json => isObject(p) && p.in === 'header' && typeof p.name === 'string' && p.name.toLowerCase() === 'idempotency-key',
    );
    if (!keyParam) throw new Failure(`${operation.method} ${operation.path} documents no Idempotency-Key header parameter`, []);
    const extensions = [keyParam, op].flatMap((o) =>
      Object.entries(o)
        .filter(([k]) => /^x-.*(idempot|expir|ttl)/i.test(k))
        .map(([, v]) => JSON.stringify(v)),
    );
    const texts = [keyParam.description, op.description, ...extensions].filter((t): t is string => typeof t === 'string');
    const policy = texts.flatMap((t) => t.split(/(?<=[.;])\s+/)).find((s) => DURATION.test(s) && EXPIRY_WORD.test(s));
    if (!policy)
      throw new Failure(
        `the Idempotency-Key of ${operation.method} ${operation.path} is documented without an expiry (a duration and what expires): ${JSON.stringify(keyParam.description ?? '')}`,
        [],
      );
    return { outcome: 'pass', detail: `"${policy.trim()}"` };
  },
};

const crashOneEffect: Check = {
  id: 'crash-one-effect',
  title: 'killed mid-flight, restarted, every key retried → one effect each, none stuck',
  async run(ctx) {
    const crash = ctx.target.crash;
    if (!crash) return { outcome: 'n/a', detail: 'no kill/start commands configured (crash)' };
    const keys = Array.from({ length: crash.keys }, () => ctx.newKey());
    const bodies = new Map(keys.map((k) => [k, ctx.bodyFor(randomUUID())]));
    const before = await ctx.count();
    // The client bounds what is in flight: the kill comes once a third have answered, with the others of the bound still out.
    let answered = 0;
    let killed: Promise<void> | undefined;
    let inFlightAtKill = 0;
    const first = await Promise.all(
      keys.map((key) =>
        ctx.send({ key, body: bodies.get(key) }).then((x) => {
          answered++;
          if (!killed && answered >= Math.ceil(keys.length / 3)) {
            inFlightAtKill = ctx.http.inFlight;
            killed = crash.kill();
          }
          return x;
        }),
      ),
    );
    await (killed ?? crash.kill());
    await crash.start();
    if (inFlightAtKill === 0) throw new Failure(`nothing was in flight at the kill: raise crash.keys (${keys.length})`, []);
    const retries = await Promise.all(keys.map((key) => retryAfterRestart(ctx, key, bodies.get(key), crash.retryWindowMs)));
    const retried = retries.map((r) => r.exchange);
    const again = await Promise.all(keys.map((key) => ctx.send({ key, body: bodies.get(key) })));
    const summary = `first: ${histogram(first, (a) => ctx.isReplay(a))}; retried: ${histogram(retried, (a) => ctx.isReplay(a))}`;
    for (let i = 0; i < keys.length; i++) {
      if (!is2xx(retried[i].answer))
        throw new Failure(`${summary}; a key ${retries[i].how} still answers ${statusOf(retried[i])} (stuck)`, [first[i], retried[i]]);
      ctx.expectReplay(retried[i], again[i], "a key's second retry");
      if (is2xx(first[i].answer) && !first[i].answer!.body.equals(retried[i].answer!.body)) {
        throw new Failure(`${summary}; a key answered before the kill got another answer after the restart (executed again)`, [
          first[i],
          retried[i],
        ]);
      }
    }
    const ids = new Set(retried.map((x) => ctx.effectOf(x.answer)));
    if (!ids.has(undefined) && ids.size !== keys.length) throw new Failure(`${summary}; ${keys.length} keys name ${ids.size} effects`, []);
    const effects = await ctx.expectEffects(before, keys.length, `${keys.length} keys across a kill`, []);
    return { outcome: 'pass', detail: `${keys.length} keys, ${inFlightAtKill} in flight at the kill; ${summary}${effects}` };
  },
};

/**
 * A key retried after a restart, as a client would: any 409 (a lock or lease from before the kill) and any
 * refused connection is asked again until `windowMs` has passed; a Retry-After pointing past that extends the
 * window to it (up to ten minutes), so a lock the API reports is outlasted and what it guarded is seen.
 */
async function retryAfterRestart(
  ctx: CheckContext,
  key: string,
  body: unknown,
  windowMs: number,
): Promise<{ exchange: Exchange; how: string }> {
  const started = Date.now();
  let deadline = started + windowMs;
  let asked = 0;
  for (;;) {
    const x = await ctx.send({ key, body });
    asked++;
    const again = !x.answer || x.answer.status === 409 || (x.answer.status === 503 && x.answer.headers['retry-after'] !== undefined);
    const how = `asked ${asked} time(s) over ${((Date.now() - started) / 1000).toFixed(1)} s after the restart`;
    if (!again || Date.now() >= deadline) return { exchange: x, how };
    const retryAfter = Number(x.answer?.headers['retry-after'] ?? NaN);
    if (retryAfter >= 0) deadline = Math.max(deadline, Math.min(Date.now() + retryAfter * 1000 + 1_000, started + 600_000));
    await sleep(retryAfter >= 0 ? Math.min(Math.max(retryAfter * 1000, 100), 5_000) : 500);
  }
}

const crashAfterEffect: Check = {
  id: 'crash-after-effect',
  title: 'killed while held after its effect is written, restarted, retried → one effect',
  async run(ctx) {
    const { crash, hold } = ctx.target;
    if (!crash || !hold)
      return {
        outcome: 'n/a',
        detail: `needs ${[!crash && 'kill/start commands (crash)', !hold && 'a way to hold a request after its effect (hold)'].filter(Boolean).join(' and ')}`,
      };
    const before = await ctx.count();
    if (before === undefined)
      return { outcome: 'n/a', detail: 'needs effects to count (effects.list or effects.command): the fault it finds is a second effect' };
    const key = ctx.newKey();
    const body = ctx.heldBody(randomUUID());
    const held = await ctx.sendHeld(key, body, before);
    await crash.kill();
    const cut = await held.exchange;
    await hold.disarm?.();
    await crash.start();
    if (cut.answer)
      throw new Failure(
        `the held request was answered (${cut.answer.status}) although the API was killed: hold does not make it wait, or kill does not stop it`,
        [cut],
      );
    const { exchange: retried, how } = await retryAfterRestart(ctx, key, body, crash.retryWindowMs);
    const after = (await ctx.count())!;
    const window = `killed inside the window (${held.signal})`;
    if (after - before > 1) {
      throw new Failure(
        `${window}, restarted, retried: ${after - before} effects from one key — the key is recorded apart from the effect`,
        [cut, retried],
      );
    }
    if (!is2xx(retried.answer))
      throw new Failure(`${window}, restarted: the retry, ${how}, still answers ${statusOf(retried)} (stuck)`, [cut, retried]);
    const again = await ctx.send({ key, body });
    ctx.expectReplay(retried, again, 'a second retry');
    if (after - before !== 1)
      throw new Failure(`${window}, restarted, retried ${retried.answer!.status}: ${after - before} effects, expected 1`, [cut, retried]);
    return { outcome: 'pass', detail: `${window}; the retry ${retried.answer!.status} (${how}), then replayed; 1 effect` };
  },
};

/** In the order they run: the crash checks last, since they restart the API. */
export const CHECKS: readonly Check[] = [
  missingKey,
  ...malformedKeys,
  retryReplays,
  anotherBody,
  parallel,
  otherCaller,
  reorderedJson,
  validationKeepsKey,
  serverErrorNotStored,
  openapiExpiry,
  crashAfterEffect,
  crashOneEffect,
];

export async function runCheck(check: Check, target: Target, http: HttpClient): Promise<CheckResult> {
  const ctx = new CheckContext(target, http);
  try {
    const verdict = await check.run(ctx);
    return {
      id: check.id,
      title: check.title,
      outcome: verdict.outcome,
      detail: verdict.detail,
      notes: ctx.notes,
      evidence: verdict.evidence ?? [],
    };
  } catch (err) {
    const failure = err instanceof Failure ? err : new Failure(`the check could not run: ${(err as Error).message}`);
    return { id: check.id, title: check.title, outcome: 'fail', detail: failure.message, notes: ctx.notes, evidence: failure.evidence };
  }
}
