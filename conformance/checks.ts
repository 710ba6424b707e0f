import { randomUUID } from 'node:crypto';
import type { Caller, Target } from './config.js';
import { type Answer, type Exchange, HttpClient, jsonOf, probe } from './http.js';

/**
 * `choice`: the API departs from the draft's or Stripe's default on purpose and consistently: reported, not a failure.
 * `inconclusive`: the check ran but could not provoke what it tests (nothing was in flight at the kill): neither verdict.
 * `broken`: the run could not test (a hold the API ignores, a kill that did not kill, a counter or command that
 * failed): the config part to fix is named; never the API's failure.
 */
export type Outcome = 'pass' | 'fail' | 'n/a' | 'choice' | 'inconclusive' | 'broken';

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

/** What checks of one run share: the parallel burst, judged by two checks (one effect; 409 carries Retry-After). */
export interface RunState {
  burst?: Burst;
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

/**
 * The run could not test: `part` is the config part to fix (base, hold, crash.kill, effects…), named first in the
 * message. Reported as `broken` (exit 2), never as the API's failure.
 */
export class BrokenRun extends Error {
  constructor(
    readonly part: string,
    message: string,
    readonly evidence: Exchange[] = [],
  ) {
    super(message);
  }
}

/** Nothing could be judged: reported as `inconclusive` (exit 3). */
class Inconclusive extends Error {}

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
    readonly run: RunState = {},
  ) {}

  /** Runs a config-given function (a command, a counter); its failure is a broken run naming `part`. */
  async hook<T>(part: string, fn: (() => Promise<T>) | undefined): Promise<T | undefined> {
    if (!fn) return undefined;
    try {
      return await fn();
    } catch (err) {
      if (err instanceof BrokenRun) throw err;
      throw new BrokenRun(part, `${part}: ${(err as Error).message}`);
    }
  }

  newKey(): string {
    return `conformance-${randomUUID()}`;
  }

  /** A valid body for a new request: its own `{{unique}}` value, if the body has the placeholder. */
  bodyFor(token: string): unknown {
    return withToken(this.target.operation.body, token);
  }

  /** Sends the operation. `key`: one value, several header lines, or none; `bodyText` as given (to control key order and spaces). */
  async send(
    options: {
      key?: string | string[];
      caller?: Caller;
      body?: unknown;
      bodyText?: string;
      headers?: Record<string, string>;
      onInformation?: (status: number) => void;
      /** Across a kill: a refused connection is an answer the check judges, not a broken run. */
      mayBeDown?: boolean;
    } = {},
  ): Promise<Exchange> {
    const headers: Record<string, string | string[]> = {
      'Content-Type': 'application/json',
      ...this.target.callers[options.caller ?? 'a'],
      ...options.headers,
    };
    if (options.key !== undefined) headers[IDEMPOTENCY_KEY] = options.key;
    const body = options.bodyText ?? JSON.stringify(options.body ?? this.bodyFor(randomUUID()));
    const x = await this.http.send(
      { method: this.target.operation.method, path: this.target.operation.path, headers, body },
      options.onInformation,
    );
    if (x.error === 'ECONNREFUSED' && !options.mayBeDown)
      throw new BrokenRun('base', `base: ${this.target.base.href} stopped answering (ECONNREFUSED) during the check`, [x]);
    return x;
  }

  /** The body a held request sends: the hold's own (with a fresh `{{unique}}`), or the operation's. */
  heldBody(token: string): unknown {
    const hold = this.target.hold;
    return hold?.body !== undefined ? withToken(hold.body, token) : this.bodyFor(token);
  }

  /**
   * Sends requests that the target holds inside its handler after their effect is written (`hold`), and resolves
   * once every one is there: each answered a 1xx, or all their effects are counted. One that answers or times out
   * first means the API does not honour the hold: a broken run naming hold, since nothing the kit does next would
   * land in the window.
   */
  async sendHeld(
    requests: { key: string; body: unknown }[],
    before: number | undefined,
  ): Promise<{ exchanges: Promise<Exchange>[]; signal: string }> {
    const hold = this.target.hold!;
    await this.hook('hold.arm', hold.arm);
    let signal!: (how: string) => void;
    const reached = new Promise<string>((resolve) => (signal = resolve));
    let informed = 0;
    const exchanges = requests.map(({ key, body }) => {
      let seen = false;
      const exchange = this.send({
        key,
        body,
        headers: hold.headers,
        onInformation: (status) => {
          if (seen) return;
          seen = true;
          if (++informed === requests.length) signal(`answered ${status} when held`);
        },
      });
      void exchange.then(
        (x) => signal(x.answer ? `final:answered ${x.answer.status}` : `final:got no answer (${x.error})`),
        (err: Error) => signal(`final:could not be sent (${err.message})`),
      );
      return exchange;
    });
    let polling = before !== undefined;
    const poll = async () => {
      while (polling) {
        if ((await this.count())! - before! >= requests.length)
          return signal(requests.length === 1 ? 'its effect counted while held' : 'their effects counted while held');
        await sleep(100);
      }
    };
    void poll().catch((err: Error) => signal(`final:could not be followed: the effect counter failed (${err.message})`));
    const how = await reached;
    polling = false;
    if (how.startsWith('final:')) {
      const settled = await Promise.all(exchanges.map((x) => x.catch(() => undefined)));
      await this.hook('hold.disarm', hold.disarm);
      throw new BrokenRun(
        'hold',
        `hold: the held request ${how.slice(6)} before a 1xx or its effect counted: the API does not honour the hold, so nothing would land in the window (fix hold, or how the API reads it: CHECKS.md, "The hold")`,
        settled.filter((x): x is Exchange => x !== undefined).slice(0, 1),
      );
    }
    return { exchanges, signal: how };
  }

  /** How many effects `caller` has, or undefined without a counter (noted once per check). */
  async count(caller: Caller = 'a'): Promise<number | undefined> {
    if (!this.target.countEffects) {
      this.note('effects not counted (no effects.list or effects.command): "one effect" and "nothing executed" are unverified');
      return undefined;
    }
    return (await this.hook('effects', () => this.target.countEffects!(caller)))!;
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

/** N identical requests under one key, the first held when a hold is configured; shared by the two checks that judge it. */
interface Burst {
  key: string;
  body: unknown;
  before: number | undefined;
  all: Exchange[];
  overlap: string;
}

async function burst(ctx: CheckContext): Promise<Burst> {
  if (ctx.run.burst) return ctx.run.burst;
  const n = ctx.target.parallel;
  const before = await ctx.count();
  const key = ctx.newKey();
  let all: Exchange[];
  let overlap = '';
  let body: unknown;
  if (ctx.target.hold) {
    // Made to overlap: the first is held inside its handler, after its effect, while the others arrive.
    body = ctx.heldBody(randomUUID());
    const held = await ctx.sendHeld([{ key, body }], before);
    const others = Array.from({ length: n - 1 }, () => ctx.send({ key, body }));
    const first = await held.exchanges[0];
    await ctx.hook('hold.disarm', ctx.target.hold.disarm);
    all = [first, ...(await Promise.all(others))];
    overlap = `; the others sent while the first was held (${held.signal})`;
  } else {
    ctx.note('the requests overlap by chance only: configure hold to make them overlap every time');
    body = ctx.bodyFor(randomUUID());
    all = await Promise.all(Array.from({ length: n }, () => ctx.send({ key, body })));
  }
  ctx.run.burst = { key, body, before, all, overlap };
  return ctx.run.burst;
}

const parallel: Check = {
  id: 'parallel-one-effect',
  title: 'N parallel identical requests → one effect; every answer the replay or a 409',
  async run(ctx) {
    const n = ctx.target.parallel;
    const { key, body, before, all, overlap } = await burst(ctx);
    const statuses = histogram(all, (a) => ctx.isReplay(a));
    const ok = all.filter((x) => is2xx(x.answer));
    if (ok.length === 0) throw new Failure(`key ${key}: ${n} parallel requests, none succeeded: ${statuses}`, all.slice(0, 2));
    // A 409 is the draft's "request outstanding"; whether it says when to come back is conflict-retry-after's verdict.
    const strays = all.filter((x) => !is2xx(x.answer) && x.answer?.status !== 409);
    if (strays.length > 0) {
      throw new Failure(
        `key ${key}: ${n} parallel requests: ${statuses}; ${strays.length} neither the replay nor a 409 (e.g. ${statusOf(strays[0])})`,
        [ok[0], strays[0]],
      );
    }
    const differing = ok.find((x) => x.answer!.status !== ok[0].answer!.status || !x.answer!.body.equals(ok[0].answer!.body));
    if (differing)
      throw new Failure(`key ${key}: ${n} parallel requests: ${statuses}; two successes differ (two executions?)`, [ok[0], differing]);
    const after = await ctx.send({ key, body });
    ctx.expectReplay(ok[0], after, 'a retry after the burst');
    const effects = await ctx.expectEffects(before, 1, `key ${key}: ${n} parallel requests with one key`, [ok[0], after]);
    return { outcome: 'pass', detail: `${statuses}${effects}${overlap}` };
  },
};

const conflictRetryAfter: Check = {
  id: 'conflict-retry-after',
  title: 'a duplicate refused while the first is in flight (409) says when to come back: Retry-After',
  async run(ctx) {
    const { key, all, overlap } = await burst(ctx);
    const conflicts = all.filter((x) => x.answer?.status === 409);
    const statuses = histogram(all, (a) => ctx.isReplay(a));
    if (conflicts.length === 0)
      return {
        outcome: 'n/a',
        detail: `no duplicate got a 409 (${statuses}): the API makes them wait or replays, nothing to judge${overlap}`,
      };
    const bare = conflicts.filter((x) => x.answer!.headers['retry-after'] === undefined);
    if (bare.length > 0)
      throw new Failure(
        `key ${key}: ${bare.length} of ${conflicts.length} 409(s) carry no Retry-After: a client cannot tell when the key is free`,
        [bare[0]],
      );
    const values = [...new Set(conflicts.map((x) => x.answer!.headers['retry-after']))].join(', ');
    return { outcome: 'pass', detail: `${conflicts.length}× 409, each with Retry-After (${values})${overlap}` };
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

/**
 * Kills the API and waits until it is seen dead: its port refuses connections. Still accepting after 10 s: the
 * kill did not kill (a broken run naming crash.kill).
 */
async function killAndSeeDead(ctx: CheckContext): Promise<void> {
  await ctx.hook('crash.kill', ctx.target.crash!.kill);
  const deadline = Date.now() + 10_000;
  for (;;) {
    const state = await probe(ctx.target.base, 1_000);
    if (state !== 'open' && !state.startsWith('no connection')) return;
    if (Date.now() > deadline)
      throw new BrokenRun(
        'crash.kill',
        `crash.kill: ${ctx.target.base.href} still accepts connections 10 s after the kill command returned: it did not kill the API`,
      );
    await sleep(50);
  }
}

/** Up to three keys, then how many more: a failure names the keys it is about. */
const someKeys = (keys: string[]) => `${keys.slice(0, 3).join(', ')}${keys.length > 3 ? ` (+${keys.length - 3} more)` : ''}`;

const crashOneEffect: Check = {
  id: 'crash-one-effect',
  title: 'killed with requests in flight, restarted, every key retried → one effect each, none stuck, none forgotten',
  async run(ctx) {
    const { crash, hold } = ctx.target;
    if (!crash) return { outcome: 'n/a', detail: 'no kill/start commands configured (crash)' };
    const keys = Array.from({ length: crash.keys }, () => ctx.newKey());
    const bodies = new Map(keys.map((k) => [k, ctx.bodyFor(randomUUID())]));
    const before = await ctx.count();
    const first = new Map<string, Promise<Exchange>>();
    const sendFirst = (key: string) => first.set(key, ctx.send({ key, body: bodies.get(key), mayBeDown: true })).get(key)!;
    let answeredBefore: string[];
    let held: string[] = [];
    let holdSignal = '';
    if (hold) {
      // Deterministic: a third answered before the kill (they must replay after it), then up to three held inside
      // their window (effect written, key not yet recorded) while the rest go out, then the kill.
      answeredBefore = keys.slice(0, Math.floor(keys.length / 3));
      await Promise.all(answeredBefore.map(sendFirst));
      held = keys.slice(answeredBefore.length, answeredBefore.length + 3);
      const heldBodies = held.map((key) => ({ key, body: bodies.get(key) }));
      const { exchanges, signal } = await ctx.sendHeld(heldBodies, before === undefined ? undefined : await ctx.count());
      held.forEach((key, i) => first.set(key, exchanges[i]));
      holdSignal = signal;
      for (const key of keys.slice(answeredBefore.length + held.length)) void sendFirst(key);
      await killAndSeeDead(ctx);
    } else {
      // By chance: the kill once a third have answered, with the others of the bound still out.
      answeredBefore = [];
      let killed: Promise<void> | undefined;
      const trigger = Math.ceil(keys.length / 3);
      for (const key of keys)
        void sendFirst(key).then((x) => {
          if (x.answer) answeredBefore.push(key);
          if (!killed && answeredBefore.length >= trigger) {
            killed = killAndSeeDead(ctx);
            // Awaited below; handled now so that a kill that fails is not an unhandled rejection meanwhile.
            killed.catch(() => undefined);
          }
        });
      await Promise.all(first.values());
      await (killed ?? killAndSeeDead(ctx));
      answeredBefore = answeredBefore.slice(0, trigger);
    }
    const firsts = new Map<string, Exchange>();
    for (const key of keys) firsts.set(key, await first.get(key)!);
    await ctx.hook('hold.disarm', hold?.disarm);
    // Decided from what happened: a request the process accepted and never answered was open when it died.
    const open = keys.filter((k) => !firsts.get(k)!.answer && firsts.get(k)!.error !== 'ECONNREFUSED');
    const heldAnswered = held.filter((k) => firsts.get(k)!.answer);
    if (heldAnswered.length > 0) {
      const x = firsts.get(heldAnswered[0])!;
      throw new BrokenRun(
        'hold',
        `hold: the held request answered ${x.answer!.status} before the API was seen dead: the hold did not keep it in its window until the kill`,
        [x],
      );
    }
    await ctx.hook('crash.start', crash.start);
    const retries = new Map<string, { exchange: Exchange; how: string }>();
    await Promise.all(keys.map(async (key) => retries.set(key, await retryAfterRestart(ctx, key, bodies.get(key), crash.retryWindowMs))));
    const retried = (k: string) => retries.get(k)!.exchange;
    const again = new Map<string, Exchange>();
    await Promise.all(keys.map(async (key) => again.set(key, await ctx.send({ key, body: bodies.get(key), mayBeDown: true }))));
    const summary = `first: ${histogram([...firsts.values()], (a) => ctx.isReplay(a))}; retried: ${histogram(keys.map(retried), (a) => ctx.isReplay(a))}`;
    const evidenceOf = (ks: string[]) => ks.slice(0, 2).flatMap((k) => [firsts.get(k)!, retried(k)]);
    const fail = (ks: string[], what: string, evidence = evidenceOf(ks)) => {
      throw new Failure(`${what}: ${someKeys(ks)}; ${summary}`, evidence);
    };
    const stuck = keys.filter((k) => !is2xx(retried(k).answer));
    if (stuck.length > 0)
      fail(
        stuck,
        `${stuck.length} key(s) still answer ${statusOf(retried(stuck[0]))} after the restart, ${retries.get(stuck[0])!.how} (stuck)`,
      );
    const executedAgain = keys.filter((k) => {
      const a = firsts.get(k)!.answer;
      return is2xx(a) && !a!.body.equals(retried(k).answer!.body);
    });
    if (executedAgain.length > 0)
      fail(
        executedAgain,
        `${executedAgain.length} key(s) answered before the kill got another answer after the restart (executed again, or the key forgotten)`,
      );
    const survived = held.filter((k) => ctx.isReplay(retried(k).answer!));
    if (survived.length > 0)
      throw new BrokenRun(
        'hold',
        `hold: key ${survived[0]}, killed while held before its key was recorded, replays after the restart: its key was recorded after the API was seen dead, so the hold outlived the process (CHECKS.md, "The hold")`,
        evidenceOf(survived),
      );
    const notReplayed = keys.filter((k) => {
      try {
        ctx.expectReplay(retried(k), again.get(k)!, "a key's second retry");
        return false;
      } catch {
        return true;
      }
    });
    if (notReplayed.length > 0)
      fail(
        notReplayed,
        `${notReplayed.length} key(s) whose second retry is not the replay of the first`,
        notReplayed.slice(0, 2).flatMap((k) => [retried(k), again.get(k)!]),
      );
    const byEffect = new Map<string | undefined, string[]>();
    for (const k of keys) byEffect.set(ctx.effectOf(retried(k).answer), [...(byEffect.get(ctx.effectOf(retried(k).answer)) ?? []), k]);
    const shared = [...byEffect].find(([id, ks]) => id !== undefined && ks.length > 1);
    if (!byEffect.has(undefined) && shared) fail(shared[1], `keys that name one effect (${shared[0]})`);
    const tested = `${keys.length} keys: ${answeredBefore.length} answered before the kill, ${open.length} open when the process was seen dead${held.length ? ` (${held.length} held in the window: ${holdSignal})` : ''}`;
    if (before !== undefined) {
      const after = (await ctx.count())!;
      // Which keys ran twice, or lost theirs: those open at the death whose retry executed anew (not a replay).
      const anew = open.filter((k) => !ctx.isReplay(retried(k).answer!));
      if (after - before > keys.length)
        fail(
          anew,
          `${after - before} effects from ${keys.length} keys (${after - before - keys.length} extra); the keys open at the death whose retry executed anew, one of which ran twice`,
        );
      if (after - before < keys.length)
        fail(
          keys.filter((k) => is2xx(firsts.get(k)!.answer) || ctx.isReplay(retried(k).answer!)),
          `${after - before} effects from ${keys.length} keys (${keys.length - (after - before)} lost); the keys answered as done, one of which has no effect`,
        );
    }
    if (open.length === 0)
      throw new Inconclusive(
        `${tested}: nothing was open when the process died (every request answered before the kill took effect, or refused after it), so nothing was tested; configure hold so the kill lands in the window every run, or raise crash.keys`,
      );
    return { outcome: 'pass', detail: `${tested}; ${summary}${before === undefined ? '' : `; ${keys.length} effect(s)`}` };
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
    const x = await ctx.send({ key, body, mayBeDown: true });
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
    const held = await ctx.sendHeld([{ key, body }], before);
    await killAndSeeDead(ctx);
    const cut = await held.exchanges[0];
    await ctx.hook('hold.disarm', hold.disarm);
    if (cut.answer)
      throw new BrokenRun(
        'hold',
        `hold: the held request answered ${cut.answer.status} before the API was seen dead: the hold did not keep it in its window until the kill`,
        [cut],
      );
    await ctx.hook('crash.start', crash.start);
    const { exchange: retried, how } = await retryAfterRestart(ctx, key, body, crash.retryWindowMs);
    const after = (await ctx.count())!;
    const window = `killed inside the window (${held.signal})`;
    if (after - before > 1) {
      throw new Failure(
        `key ${key}: ${window}, restarted, retried: ${after - before} effects from one key — the key is recorded apart from the effect, or the API forgot its keys on restart (a key store that does not survive it): from outside the two look the same`,
        [cut, retried],
      );
    }
    if (!is2xx(retried.answer))
      throw new Failure(`key ${key}: ${window}, restarted: the retry, ${how}, still answers ${statusOf(retried)} (stuck)`, [cut, retried]);
    if (ctx.isReplay(retried.answer!))
      throw new BrokenRun(
        'hold',
        `hold: key ${key}, killed while held before its key was recorded, replays after the restart: its key was recorded after the API was seen dead, so the hold outlived the process (CHECKS.md, "The hold")`,
        [cut, retried],
      );
    const again = await ctx.send({ key, body });
    ctx.expectReplay(retried, again, `key ${key}: a second retry`);
    if (after - before !== 1)
      throw new Failure(
        `key ${key}: ${window}, restarted, retried ${retried.answer!.status}: ${after - before} effects, expected 1 (its effect lost)`,
        [cut, retried],
      );
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
  conflictRetryAfter,
  otherCaller,
  reorderedJson,
  validationKeepsKey,
  serverErrorNotStored,
  openapiExpiry,
  crashAfterEffect,
  crashOneEffect,
];

export async function runCheck(check: Check, target: Target, http: HttpClient, run: RunState = {}): Promise<CheckResult> {
  const ctx = new CheckContext(target, http, run);
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
    const [outcome, evidence]: [Outcome, Exchange[]] =
      err instanceof Failure
        ? ['fail', err.evidence]
        : err instanceof BrokenRun
          ? ['broken', err.evidence]
          : err instanceof Inconclusive
            ? ['inconclusive', []]
            : ['broken', []];
    const detail =
      outcome === 'broken' && !(err instanceof BrokenRun) ? `the check could not run: ${(err as Error).message}` : (err as Error).message;
    return { id: check.id, title: check.title, outcome, detail, notes: ctx.notes, evidence };
  }
}
