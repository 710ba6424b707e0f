import { randomUUID } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import { Webhook } from 'standardwebhooks';
import { ALICE, BOB, bearer, PSP_AUTH, startTestApp, WEBHOOK_SECRET, type TestApp } from './support/test-app';

/**
 * Schema-driven fuzzing of every operation in the document the app serves at /docs-json: for each
 * path and method a valid request is built from the document itself (its examples, types, formats),
 * then mutated — missing required fields, wrong types, huge/negative/fractional numbers, odd
 * Unicode, oversized and deeply nested bodies, non-object bodies, broken JSON, wrong content types,
 * missing/duplicated/malformed headers, odd query strings and path ids — and sent over real HTTP.
 *
 * Every answer must be one the document promises for that operation: never a 500; a 5xx only where
 * the operation documents it (503 of the payment routes, the sandbox, the webhook consumer and
 * /health: the provider or database is unavailable, and clients are told to retry); every error an
 * application/problem+json whose status member is the HTTP status and whose body matches the
 * documented problem schema; every 2xx body matching its documented schema. `default` (the document's
 * "a replayed answer") only covers answers carrying Idempotent-Replayed: true.
 *
 * Deterministic: one seeded PRNG drives every choice, requests go one at a time. FUZZ_SEED and
 * FUZZ_RUNS (requests per operation) run more; a failure prints the seed and the exact request.
 * FUZZ_DEBUG=1 prints the answer to each operation's valid request (each should be a 2xx).
 */

const SEED = Number(process.env.FUZZ_SEED ?? 0x1d3a7c5);
/** 30 per operation: ~650 requests, every mutation kind drawn several times per operation with the default seed. */
const RUNS = Number(process.env.FUZZ_RUNS ?? 30);
const PROBLEM_JSON = /^application\/problem\+json/;

/**
 * Cases the fuzzer knows to fail and that are not fixed here: operation + mutation kind → why.
 * Empty: every finding so far was fixed.
 */
const KNOWN_FAILURES: Record<string, string> = {};

// ---------------------------------------------------------------------------------------------
// A seeded PRNG (mulberry32): the same seed gives the same requests, so a failure replays.
function prng(seed: number) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    int: (lo: number, hi: number) => lo + Math.floor(next() * (hi - lo + 1)),
    pick: <T>(xs: readonly T[]): T => xs[Math.floor(next() * xs.length)],
    chance: (p: number) => next() < p,
  };
}
type Rng = ReturnType<typeof prng>;

/** A UUID from the PRNG (v4 layout), so that "random" ids replay too. */
function seededUuid(rng: Rng): string {
  const hex = Array.from({ length: 32 }, () => rng.int(0, 15).toString(16));
  hex[12] = '4';
  hex[16] = '89ab'[rng.int(0, 3)];
  const h = hex.join('');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

// ---------------------------------------------------------------------------------------------
// The subset of OpenAPI 3 / JSON Schema the document uses.
interface Schema {
  $ref?: string;
  type?: string;
  format?: string;
  enum?: unknown[];
  required?: string[];
  properties?: Record<string, Schema>;
  additionalProperties?: Schema | boolean;
  items?: Schema;
  nullable?: boolean;
  oneOf?: Schema[];
  allOf?: Schema[];
  anyOf?: Schema[];
  pattern?: string;
  minimum?: number;
  maximum?: number;
  minLength?: number;
  maxLength?: number;
  minItems?: number;
  maxItems?: number;
  example?: unknown;
}
interface Parameter {
  name: string;
  in: 'path' | 'query' | 'header';
  required?: boolean;
  schema?: Schema;
}
interface MediaType {
  schema?: Schema;
}
interface Operation {
  operationId?: string;
  parameters?: Parameter[];
  requestBody?: { required?: boolean; content: Record<string, MediaType> };
  responses: Record<string, { content?: Record<string, MediaType>; headers?: Record<string, unknown> }>;
  security?: Record<string, string[]>[];
}
interface Document {
  paths: Record<string, Record<string, Operation>>;
  components: { schemas: Record<string, Schema> };
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
/** RFC 3339 date-time, as toISOString writes it and as the document promises. */
const DATE_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/;

/** Errors found validating `value` against `schema` (empty: it matches), each with its JSON path. */
function validate(doc: Document, schema: Schema, value: unknown, path = '$'): string[] {
  if (schema.$ref) return validate(doc, resolveRef(doc, schema.$ref), value, path);
  if (value === null)
    return schema.nullable || (schema.type === undefined && !schema.allOf && !schema.oneOf) ? [] : [`${path}: null but not nullable`];
  const errors: string[] = [];
  if (schema.allOf) for (const part of schema.allOf) errors.push(...validate(doc, part, value, path));
  if (schema.oneOf) {
    const matching = schema.oneOf.filter((s) => validate(doc, s, value, path).length === 0).length;
    if (matching !== 1)
      errors.push(`${path}: matches ${matching} of the ${schema.oneOf.length} oneOf schemas (${JSON.stringify(value).slice(0, 200)})`);
  }
  if (schema.anyOf && !schema.anyOf.some((s) => validate(doc, s, value, path).length === 0)) errors.push(`${path}: matches none of anyOf`);
  if (schema.enum && !schema.enum.includes(value))
    errors.push(`${path}: ${JSON.stringify(value)} is not one of ${JSON.stringify(schema.enum)}`);
  switch (schema.type) {
    case 'string':
      if (typeof value !== 'string') return [...errors, `${path}: expected a string, got ${JSON.stringify(value)}`];
      if (schema.format === 'uuid' && !UUID.test(value)) errors.push(`${path}: ${value} is not a uuid`);
      if (schema.format === 'date-time' && (!DATE_TIME.test(value) || Number.isNaN(Date.parse(value))))
        errors.push(`${path}: ${value} is not a date-time`);
      if (schema.pattern && !new RegExp(schema.pattern, 'u').test(value)) errors.push(`${path}: ${value} does not match ${schema.pattern}`);
      break;
    case 'number':
    case 'integer':
      if (typeof value !== 'number' || !Number.isFinite(value))
        return [...errors, `${path}: expected a ${schema.type}, got ${JSON.stringify(value)}`];
      if (schema.type === 'integer' && !Number.isInteger(value)) errors.push(`${path}: ${value} is not an integer`);
      if (schema.minimum !== undefined && value < schema.minimum) errors.push(`${path}: ${value} < minimum ${schema.minimum}`);
      if (schema.maximum !== undefined && value > schema.maximum) errors.push(`${path}: ${value} > maximum ${schema.maximum}`);
      break;
    case 'boolean':
      if (typeof value !== 'boolean') errors.push(`${path}: expected a boolean`);
      break;
    case 'array':
      if (!Array.isArray(value)) return [...errors, `${path}: expected an array`];
      if (schema.items) value.forEach((item, i) => errors.push(...validate(doc, schema.items!, item, `${path}[${i}]`)));
      break;
    case 'object':
    case undefined:
      if (schema.type === 'object' && (typeof value !== 'object' || Array.isArray(value)))
        return [...errors, `${path}: expected an object`];
      if (typeof value === 'object' && !Array.isArray(value)) {
        const record = value as Record<string, unknown>;
        for (const name of schema.required ?? []) if (!(name in record)) errors.push(`${path}: required member ${name} is missing`);
        for (const [name, child] of Object.entries(record)) {
          const sub =
            schema.properties?.[name] ?? (typeof schema.additionalProperties === 'object' ? schema.additionalProperties : undefined);
          if (sub) errors.push(...validate(doc, sub, child, `${path}.${name}`));
        }
      }
      break;
  }
  return errors;
}

function resolveRef(doc: Document, ref: string): Schema {
  const name = ref.replace('#/components/schemas/', '');
  const schema = doc.components.schemas[name];
  if (!schema) throw new Error(`unresolvable $ref ${ref}`);
  return schema;
}

// ---------------------------------------------------------------------------------------------
// Valid values from the document.

/** Ids of real resources, filled in beforeAll: uuid-format values draw from them half the time. */
interface Pools {
  orderIds: string[];
  /** Unpaid orders, each used once by a provider-fault payment so that it reaches the provider. */
  payableOrderIds: string[];
  paymentIds: string[];
  refundIds: string[];
  chargeIds: string[];
}

let orderNumbers = 0;

function validValue(doc: Document, schema: Schema, rng: Rng, pools: Pools, name = ''): unknown {
  if (schema.$ref) return validValue(doc, resolveRef(doc, schema.$ref), rng, pools, name);
  if (schema.allOf)
    return validValue(doc, Object.assign({}, ...schema.allOf.map((s) => (s.$ref ? resolveRef(doc, s.$ref) : s))), rng, pools, name);
  if (schema.oneOf) return validValue(doc, rng.pick(schema.oneOf), rng, pools, name);
  // A fresh order number each time, or every create would meet the first one's (a documented 409, but one answer only).
  if (name === 'orderNumber') return `FZ-${SEED.toString(36)}-${++orderNumbers}`;
  if (name === 'chargeId' && pools.chargeIds.length) return rng.pick(pools.chargeIds);
  if (schema.example !== undefined && schema.example !== null) return schema.example;
  if (schema.enum) return rng.pick(schema.enum);
  switch (schema.type) {
    case 'string':
      if (schema.format === 'uuid')
        return name === 'orderId' && pools.orderIds.length && rng.chance(0.5) ? rng.pick(pools.orderIds) : seededUuid(rng);
      if (schema.format === 'date-time') return new Date().toISOString();
      return 'x'.repeat(Math.max(1, schema.minLength ?? 1));
    case 'number':
    case 'integer':
      return Math.max(schema.minimum ?? 1, 1);
    case 'boolean':
      return true;
    case 'array':
      return Array.from({ length: Math.max(1, schema.minItems ?? 1) }, () => validValue(doc, schema.items ?? {}, rng, pools));
    default: {
      const out: Record<string, unknown> = {};
      const props = Object.entries(schema.properties ?? {});
      for (const [prop, sub] of props) {
        if (schema.required?.includes(prop) || rng.chance(0.5)) out[prop] = validValue(doc, sub, rng, pools, prop);
      }
      // An update needs something to change: never an empty object where members exist.
      if (!Object.keys(out).length && props.length) out[props[0][0]] = validValue(doc, props[0][1], rng, pools, props[0][0]);
      return out;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Mutations.

/** Every path to a value inside a JSON value (objects and arrays), the root excluded. */
function paths(value: unknown, prefix: (string | number)[] = []): (string | number)[][] {
  if (value === null || typeof value !== 'object') return [];
  const out: (string | number)[][] = [];
  for (const [k, v] of Object.entries(value)) {
    const p = [...prefix, Array.isArray(value) ? Number(k) : k];
    out.push(p, ...paths(v, p));
  }
  return out;
}
function setAt(root: unknown, path: (string | number)[], value: unknown, remove = false): void {
  let node = root as Record<string | number, unknown>;
  for (const key of path.slice(0, -1)) node = node[key] as Record<string | number, unknown>;
  const last = path[path.length - 1];
  if (remove) {
    if (Array.isArray(node)) node.splice(last as number, 1);
    else delete node[last];
  } else node[last] = value;
}

const HUGE_NUMBERS = [
  '1e309',
  '-1',
  '-0',
  '0',
  '1.5',
  '9007199254740993',
  '-9007199254740993',
  '1e21',
  '123456789012345678901234567890',
  '2147483648',
  '-2147483649',
  '0.0000001',
  '1E2',
];
const ODD_STRINGS = [
  '',
  ' ',
  '\u0000',
  'a\u0000b',
  '\ud800',
  '\udfff lone low',
  '\u202eevil',
  '\ufeffbom',
  '𝔘𝔫𝔦𝔠𝔬𝔡𝔢 👩‍👩‍👧‍👦',
  'e\u0301\u0301\u0301',
  "'; DROP TABLE orders; --",
  '%00%ff',
  '../../etc/passwd',
  '${jndi:ldap://x}',
  '<script>alert(1)</script>',
  'x'.repeat(70_000),
  'ü'.repeat(300),
  '__proto__',
  'constructor',
  'tok_visa\n',
];
const WRONG_TYPES: unknown[] = [0, -1, 1.5, true, false, null, 'str', [], [1, 2], {}, { nested: { a: 1 } }, '2026-11-30T00:00:00Z'];

interface Request {
  method: string;
  path: string;
  /** Raw header pairs: duplicates are sent as separate lines. */
  headers: [string, string][];
  body?: string;
}
interface Case {
  kind: string;
  request: Request;
}

/**
 * encodeURIComponent, except that a lone surrogate goes out as the bytes of its code point (%ED%A0%80): not UTF-8, as a hostile client may
 * send.
 */
function encodeUrlPart(value: string): string {
  return Array.from(value, (ch) => {
    const code = ch.charCodeAt(0);
    if (ch.length === 1 && code >= 0xd800 && code <= 0xdfff)
      return Array.from(
        Buffer.from([0xe0 | (code >> 12), 0x80 | ((code >> 6) & 0x3f), 0x80 | (code & 0x3f)]),
        (b) => `%${b.toString(16).toUpperCase()}`,
      ).join('');
    return encodeURIComponent(ch);
  }).join('');
}

function deepBody(depth: number, array: boolean): string {
  return array ? '['.repeat(depth) + ']'.repeat(depth) : '{"a":'.repeat(depth) + '1' + '}'.repeat(depth);
}

/**
 * One request for `op`: run 0 the valid one, every later run one mutation of it. `freshOrderId`, when
 * given, is an order just created (version 1) that the valid request of an /orders/{id} route uses, so
 * it can succeed whatever earlier runs did to the shared orders.
 */
function buildCase(
  doc: Document,
  route: string,
  method: string,
  op: Operation,
  rng: Rng,
  pools: Pools,
  run: number,
  signer: Webhook,
  freshOrderId?: string,
): Case {
  const params = op.parameters ?? [];
  const bodySchema = op.requestBody?.content['application/json']?.schema;
  const headerNames = params.filter((p) => p.in === 'header').map((p) => p.name.toLowerCase());
  const hasIdempotencyKey = headerNames.includes('idempotency-key');
  const isWebhook = headerNames.includes('webhook-signature');
  const needsAuth = (op.security ?? []).some((s) => 'bearer' in s);
  // The sandbox provider's operations take its own secret key instead (a client's API key is a 401 there).
  const needsProviderKey = (op.security ?? []).some((s) => 'providerKey' in s);

  // Path ids: a real resource of the right kind most of the time, else a random uuid or not a uuid at all.
  const pool = route.startsWith('/orders/')
    ? pools.orderIds
    : route.startsWith('/payments/')
      ? pools.paymentIds
      : route.startsWith('/refunds/')
        ? pools.refundIds
        : [];
  const idFor = (): string => (pool.length && rng.chance(0.6) ? rng.pick(pool) : seededUuid(rng));
  const valid = run === 0;
  const payments = pools.paymentIds;
  let pathValues: Record<string, string> = Object.fromEntries(
    params
      .filter((p) => p.in === 'path')
      // The valid request names a resource it can succeed on: the fresh order, the refundable payment (of the cancelled order 0).
      .map((p) => [
        p.name,
        !valid
          ? idFor()
          : freshOrderId && route.startsWith('/orders/')
            ? freshOrderId
            : route.startsWith('/payments/')
              ? payments[0]
              : route.startsWith('/refunds/')
                ? pools.refundIds[0]
                : idFor(),
      ]),
  );

  const query: [string, string][] = [];
  for (const p of params.filter((x) => x.in === 'query')) {
    // The cursor is opaque (only a nextCursor is valid): the valid request leaves it out, mutations send junk.
    if (p.name === 'cursor' || !rng.chance(0.4)) continue;
    const v = validValue(doc, p.schema ?? { type: 'string' }, rng, pools, p.name);
    query.push([p.name, String(v)]);
  }

  let body: unknown = bodySchema ? validValue(doc, bodySchema, rng, pools) : undefined;
  let rawBody: string | undefined;
  let contentType: string | undefined = bodySchema ? 'application/json' : undefined;
  const headers: [string, string][] = [];
  // Now and then Bob, who owns none of the resources: his answers are 404s.
  if (needsAuth) headers.push(['Authorization', bearer(valid || rng.chance(0.85) ? ALICE : BOB)]);
  if (needsProviderKey) headers.push(['Authorization', PSP_AUTH]);
  if (hasIdempotencyKey) headers.push(['Idempotency-Key', randomUUID()]);
  if (headerNames.includes('if-match'))
    headers.push(['If-Match', valid ? '"1"' : rng.pick(['"1"', '"2"', '*', '"0"', 'W/"1"', '"1", "2"'])]);

  // Mutation 0 of every operation is the valid request; the rest draw one kind each.
  const kinds = [
    'missing-required',
    'wrong-type',
    'odd-number',
    'odd-string',
    'extra-member',
    'not-an-object',
    'broken-json',
    'oversized',
    'deeply-nested',
    'wrong-content-type',
    'body-on-bodiless',
    'bad-auth',
    'bad-idempotency-key',
    'duplicated-headers',
    'odd-query',
    'odd-path-id',
    'provider-fault',
    'replay',
  ] as const;
  const kind = valid ? 'valid' : rng.pick(kinds);

  const mutateBodyAt = (choose: (path: (string | number)[]) => unknown) => {
    const all = paths(body);
    if (!all.length) return false;
    const p = rng.pick(all);
    setAt(body, p, choose(p));
    return true;
  };

  switch (kind) {
    case 'valid':
      break;
    case 'missing-required': {
      const all = paths(body);
      if (all.length) setAt(body, rng.pick(all), undefined, true);
      else if (bodySchema) body = {};
      else headers.splice(0, headers.length);
      break;
    }
    case 'wrong-type':
      if (!mutateBodyAt(() => rng.pick(WRONG_TYPES)) && bodySchema) body = rng.pick(WRONG_TYPES);
      break;
    case 'odd-number': {
      // Numbers are written into the raw JSON, so 1e309, -0 and 2^53+1 reach the parser as sent.
      const marker = '"__FUZZ_NUMBER__"';
      if (mutateBodyAt(() => '__FUZZ_NUMBER__')) rawBody = JSON.stringify(body).replace(marker, rng.pick(HUGE_NUMBERS));
      else query.push([rng.pick(['limit', 'amountMinor', 'x']), rng.pick(HUGE_NUMBERS)]);
      break;
    }
    case 'odd-string':
      if (!mutateBodyAt(() => rng.pick(ODD_STRINGS)))
        query.push([rng.pick(['cursor', 'status', 'orderId', 'chargeId', 'q']), rng.pick(ODD_STRINGS).slice(0, 2000)]);
      break;
    case 'extra-member':
      if (body && typeof body === 'object' && !Array.isArray(body))
        (body as Record<string, unknown>)[rng.pick(['extra', '__proto__', 'constructor', 'id', 'status', 'totalMinor'])] =
          rng.pick(WRONG_TYPES);
      else body = { extra: 1 };
      contentType = 'application/json';
      break;
    case 'not-an-object':
      rawBody = rng.pick(['null', '[]', '[{}]', '"x"', '0', 'true', '""', '1e999']);
      contentType = 'application/json';
      break;
    case 'broken-json':
      rawBody = rng.pick([
        '{',
        '{"a":',
        '{"a":1,}',
        "{'a':1}",
        '\u0000',
        '{"a":"\\ud800"}',
        '{"a":"\\u0000"}',
        'NaN',
        '{"__proto__":{"polluted":1}}',
        '\ufeff{}',
      ]);
      contentType = 'application/json';
      break;
    case 'oversized':
      rawBody = JSON.stringify({
        ...(typeof body === 'object' && body ? body : {}),
        pad: 'x'.repeat(rng.pick([65 * 1024, 200 * 1024, 1024 * 1024])),
      });
      contentType = 'application/json';
      break;
    case 'deeply-nested':
      rawBody = deepBody(rng.pick([65, 200, 5_000, 50_000]), rng.chance(0.5));
      contentType = 'application/json';
      break;
    case 'wrong-content-type':
      contentType = rng.pick([
        'text/plain',
        'application/x-www-form-urlencoded',
        'multipart/form-data; boundary=x',
        'application/xml',
        'application/json; charset=latin1',
        'application/merge-patch+json',
        'application/JSON',
        '',
        'application/json, text/plain',
      ]);
      rawBody = body === undefined ? 'a=1' : JSON.stringify(body);
      break;
    case 'body-on-bodiless':
      rawBody = rng.pick(['{}', 'a=1', '{"x":1}']);
      contentType = rng.pick(['application/json', 'text/plain']);
      break;
    case 'bad-auth': {
      const i = headers.findIndex(([n]) => n === 'Authorization');
      if (i >= 0) headers.splice(i, 1);
      const bad = rng.pick([
        undefined,
        'Bearer',
        'Bearer ',
        'Basic YWxpY2U6eA==',
        'Bearer wrong-secret',
        `bearer ${ALICE.secret}`,
        `Bearer ${ALICE.secret} extra`,
        `Bearer ${'x'.repeat(5000)}`,
      ]);
      if (bad !== undefined) headers.push(['Authorization', bad]);
      break;
    }
    case 'bad-idempotency-key': {
      const i = headers.findIndex(([n]) => n === 'Idempotency-Key');
      if (i >= 0) headers.splice(i, 1);
      const bad = rng.pick([
        undefined,
        '',
        ' ',
        'x'.repeat(256),
        '"unterminated',
        '"quoted-key"',
        'a, b',
        ':Ynl0ZXM=:',
        '\u00fc\u00e9',
        '?1',
        '"a\\"b"',
      ]);
      if (bad !== undefined) headers.push(['Idempotency-Key', bad]);
      break;
    }
    case 'duplicated-headers': {
      const name = rng.pick(['Idempotency-Key', 'Authorization', 'Content-Type', 'If-Match', 'Submit-Token', 'webhook-id']);
      const existing = headers.find(([n]) => n === name);
      const value =
        name === 'Content-Type'
          ? 'application/json'
          : name === 'Authorization'
            ? bearer(ALICE)
            : name === 'Submit-Token'
              ? 'A'.repeat(43)
              : randomUUID();
      headers.push([name, value], [name, existing?.[1] ?? value]);
      if (name === 'Content-Type') contentType = undefined;
      break;
    }
    case 'odd-query':
      query.push(
        ...rng.pick<[string, string][]>([
          [
            ['limit', '1'],
            ['limit', '2'],
          ],
          [['limit', '-5']],
          [['limit', 'abc']],
          [['limit', '100000']],
          [['cursor', 'not-a-cursor']],
          [['cursor', Buffer.from('{"t":"x","id":"y"}').toString('base64url')]],
          [['status', 'teleported']],
          [['status[]', 'created']],
          [['a[b][c][d][e][f]', '1']],
          [['orderId', 'not-a-uuid']],
          [['chargeId', 'ch_' + 'z'.repeat(24)]],
          [['__proto__[x]', '1']],
        ]),
      );
      break;
    case 'provider-fault':
      // The sandbox's fault tokens: declines, flaky and unavailable providers, answers too late or never.
      // Their 402s and 503s are documented answers; a 500 is not.
      if (route === '/orders/{id}/payments' && pools.payableOrderIds.length) pathValues.id = pools.payableOrderIds.shift()!;
      if (body && typeof body === 'object' && 'source' in body) {
        (body as Record<string, unknown>).source = rng.pick([
          'tok_chargeDeclined',
          'tok_refundDeclined',
          'tok_flaky',
          'tok_unavailable',
          'tok_timeout',
          'tok_lost',
          'tok_slow',
        ]);
      }
      break;
    case 'replay':
      // Sent twice by the loop with the same headers: the second is a replay where the operation keeps keys.
      break;
    case 'odd-path-id':
      pathValues = Object.fromEntries(
        Object.keys(pathValues).map((k) => [
          k,
          rng.pick([
            'not-a-uuid',
            '0',
            '-1',
            '1e309',
            'ü',
            '%00',
            seededUuid(rng).toUpperCase(),
            `${seededUuid(rng)}x`,
            'x'.repeat(2000),
            '00000000-0000-0000-0000-000000000000',
          ]),
        ]),
      );
      break;
  }

  if (rawBody === undefined && body !== undefined) rawBody = JSON.stringify(body);
  if (rawBody !== undefined && contentType !== undefined && contentType !== '') headers.push(['Content-Type', contentType]);

  if (isWebhook && kind !== 'duplicated-headers') {
    // The consumer's documented answer to an unsigned or badly signed delivery is 401: most
    // deliveries here are signed correctly, so the mutated bodies reach the consumer itself.
    const id = `msg_fz_${run}_${rng.int(0, 1e9)}`;
    const at = new Date();
    const signature = signer.sign(id, at, rawBody ?? '');
    const variant = valid ? 'signed' : rng.pick(['signed', 'signed', 'signed', 'unsigned', 'bad-signature', 'stale']);
    if (variant !== 'unsigned') {
      headers.push(
        ['webhook-id', id],
        ['webhook-timestamp', String(Math.floor((variant === 'stale' ? at.getTime() - 3_600_000 : at.getTime()) / 1000))],
      );
      headers.push(['webhook-signature', variant === 'bad-signature' ? 'v1,' + Buffer.alloc(32).toString('base64') : signature]);
    }
  }

  const path = route.replace(/\{(\w+)\}/g, (_, name: string) => encodeUrlPart(pathValues[name]));
  const qs = query.length ? '?' + query.map(([k, v]) => `${encodeUrlPart(k)}=${encodeUrlPart(v)}`).join('&') : '';
  return { kind, request: { method: method.toUpperCase(), path: path + qs, headers, body: rawBody } };
}

// ---------------------------------------------------------------------------------------------
// Sending and checking.

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
}

function send(base: string, req: Request): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const url = new URL(base);
    // Raw header lines (so duplicates stay duplicates); Node then adds no Host itself, and its server refuses a request without one.
    const raw: string[] = ['Host', url.host];
    for (const [n, v] of req.headers) raw.push(n, v);
    const payload = req.body === undefined ? undefined : Buffer.from(req.body, 'utf8');
    // As fetch and curl do: Content-Length even for an empty POST (else Node would send it chunked).
    if (payload || req.method !== 'GET') raw.push('Content-Length', String(payload?.length ?? 0));
    const r = httpRequest(
      { host: url.hostname, port: url.port, method: req.method, path: req.path, headers: raw, timeout: 30_000 },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text: Buffer.concat(chunks).toString('utf8') }));
        res.on('error', reject);
      },
    );
    r.on('timeout', () => r.destroy(new Error('no answer within 30 s')));
    r.on('error', reject);
    r.end(payload);
  });
}

/** What is wrong with this answer to this operation (empty: nothing). */
function check(doc: Document, op: Operation, answer: Answer): string[] {
  const contentType = String(answer.headers['content-type'] ?? '');
  const replayed = answer.headers['idempotent-replayed'] === 'true';
  const documented = op.responses[String(answer.status)] ?? (replayed ? op.responses.default : undefined);
  const problems: string[] = [];
  if (answer.status >= 500 && !(answer.status === 503 && op.responses['503']))
    problems.push(`status ${answer.status} (a server error not documented for this operation)`);
  if (!documented)
    problems.push(`status ${answer.status} is not documented for this operation (documented: ${Object.keys(op.responses).join(', ')})`);
  let body: unknown;
  if (/json/.test(contentType)) {
    try {
      body = JSON.parse(answer.text);
    } catch {
      problems.push(`a ${contentType} body that is not JSON`);
    }
  }
  if (answer.status >= 400) {
    if (!PROBLEM_JSON.test(contentType)) problems.push(`an error as ${contentType || 'no content type'}, not application/problem+json`);
    const p = body as { type?: unknown; title?: unknown; status?: unknown } | undefined;
    if (typeof p?.type !== 'string' || typeof p.title !== 'string' || p.status !== answer.status)
      problems.push(`problem members type/title/status wrong: ${answer.text.slice(0, 300)}`);
  }
  const media = documented?.content && Object.entries(documented.content).find(([type]) => contentType.startsWith(type));
  if (documented?.content && !media && answer.status !== 304)
    problems.push(`content type ${contentType} is not documented for ${answer.status} (${Object.keys(documented.content).join(', ')})`);
  if (media?.[1].schema) {
    const value = /json/.test(contentType) ? body : answer.text;
    problems.push(
      ...validate(doc, media[1].schema, value)
        .map((e) => `body does not match the documented schema: ${e}`)
        .slice(0, 5),
    );
  }
  return problems;
}

function describeRequest(req: Request): string {
  const body =
    req.body === undefined
      ? ''
      : req.body.length > 600
        ? `${req.body.slice(0, 300)}…(${req.body.length} chars)…${req.body.slice(-100)}`
        : req.body;
  return `${req.method} ${req.path.length > 300 ? req.path.slice(0, 300) + '…' : req.path}\n${req.headers.map(([n, v]) => `${n}: ${v.length > 200 ? v.slice(0, 200) + '…' : v}`).join('\n')}\n\n${body}`;
}

// ---------------------------------------------------------------------------------------------

describe(`schema-driven fuzzing of every operation (FUZZ_SEED=${SEED} FUZZ_RUNS=${RUNS})`, () => {
  let t: TestApp;
  let doc: Document;
  const pools: Pools = { orderIds: [], payableOrderIds: [], paymentIds: [], refundIds: [], chargeIds: [] };
  const signer = new Webhook(WEBHOOK_SECRET);
  const post = (path: string, body: object) =>
    send(t.url, {
      method: 'POST',
      path,
      headers: [
        ['Authorization', bearer(ALICE)],
        ['Idempotency-Key', randomUUID()],
        ['Content-Type', 'application/json'],
      ],
      body: JSON.stringify(body),
    });
  let setupOrders = 0;
  async function createOrder(): Promise<string> {
    const res = await post('/orders', {
      orderNumber: `FZ-SETUP-${++setupOrders}`,
      currency: 'EUR',
      items: [{ sku: 'SKU-1', quantity: 2, unitPriceMinor: 1250 }],
    });
    expect(`${res.status} ${res.text}`).toMatch(/^201 /);
    return (JSON.parse(res.text) as { id: string }).id;
  }

  beforeAll(async () => {
    t = await startTestApp({
      PSP_WEBHOOK_URL: 'none',
      RECONCILE_INTERVAL_MS: '0',
      PSP_TIMEOUT_MS: '300',
      PSP_MAX_ATTEMPTS: '3',
      IDEMPOTENCY_LEASE_SECONDS: '5',
    });
    doc = (await (await fetch(`${t.url}/docs-json`)).json()) as Document;
    // Real resources, so that some requests reach the code past the 404: orders in every early
    // state, a paid one, its payment and a refund of part of it.
    for (let i = 0; i < 4; i++) pools.orderIds.push(await createOrder());
    for (let i = 0; i < 6; i++) pools.payableOrderIds.push(await createOrder());
    // Orders 0 and 1 paid; order 0 then cancelled and part of its payment refunded (a refund needs a cancelled order).
    for (const orderId of pools.orderIds.slice(0, 2)) {
      const paid = await post(`/orders/${orderId}/payments`, { source: 'tok_visa' });
      expect(`${paid.status} ${paid.text}`).toMatch(/^201 /);
      const payment = JSON.parse(paid.text) as { id: string; providerTransactionId: string };
      pools.paymentIds.push(payment.id);
      // Only order 1's charge is fuzzed at /psp/refunds directly: refunds there would leave payment 0 nothing to refund through us.
      if (orderId === pools.orderIds[1]) pools.chargeIds.push(payment.providerTransactionId);
    }
    const cancelled = await send(t.url, {
      method: 'POST',
      path: `/orders/${pools.orderIds[0]}/cancel`,
      headers: [
        ['Authorization', bearer(ALICE)],
        ['Idempotency-Key', randomUUID()],
      ],
    });
    expect(cancelled.status).toBe(200);
    const refunded = await post(`/payments/${pools.paymentIds[0]}/refunds`, { amountMinor: 100 });
    expect(`${refunded.status} ${refunded.text}`).toMatch(/^201 /);
    pools.refundIds.push((JSON.parse(refunded.text) as { id: string }).id);
  });
  /** A new order in the state the route's valid request can succeed from: paid before /ship, shipped before /deliver. */
  async function freshOrderFor(route: string): Promise<string> {
    const id = await createOrder();
    const steps = route.endsWith('/ship') ? ['payments'] : route.endsWith('/deliver') ? ['payments', 'ship'] : [];
    for (const step of steps) {
      const res = await post(`/orders/${id}/${step}`, step === 'payments' ? { source: 'tok_visa' } : {});
      expect(`${res.status} ${res.text}`).toMatch(/^20[01] /);
    }
    return id;
  }
  afterAll(async () => {
    await t?.close();
  });

  it('answers every generated and mutated request as the document says: no 500, problem+json errors with documented statuses, 2xx bodies matching their schemas', async () => {
    const rng = prng(SEED);
    /** One example per operation, mutation kind and first complaint: a bug shows once, with how often it happened. */
    const failures = new Map<string, { report: string; times: number }>();
    const known: string[] = [];
    const counts: Record<string, number> = {};
    let sent = 0;
    const started = Date.now();
    for (const [route, methods] of Object.entries(doc.paths)) {
      if (route.startsWith('/docs')) continue;
      for (const [method, op] of Object.entries(methods)) {
        const freshOrderId = route.startsWith('/orders/{id}') ? await freshOrderFor(route) : undefined;
        for (let run = 0; run < RUNS; run++) {
          const c = buildCase(doc, route, method, op, rng, pools, run, signer, freshOrderId);
          let problems: string[];
          let answer: Answer | undefined;
          try {
            answer = await send(t.url, c.request);
            problems = check(doc, op, answer);
            if (c.kind === 'replay') {
              const first = answer;
              answer = await send(t.url, c.request);
              problems.push(...check(doc, op, answer).map((p) => `the repeat: ${p}`));
              // A kept key answers the repeat with the first answer; an operation without keys just answers again.
              if (answer.headers['idempotent-replayed'] === 'true' && answer.status !== first.status)
                problems.push(`the replay answered ${answer.status}, the first request ${first.status}`);
            }
          } catch (err) {
            problems = [`no answer: ${(err as Error).message}`];
          }
          sent++;
          const statusKey = `${method.toUpperCase()} ${route} ${answer?.status ?? 'none'}`;
          counts[statusKey] = (counts[statusKey] ?? 0) + 1;
          if (process.env.FUZZ_DEBUG && c.kind === 'valid')
            console.log(method.toUpperCase(), route, answer?.status, answer?.text.slice(0, 400));
          if (!problems.length) continue;
          const report = `[seed ${SEED}, run ${run}, ${c.kind}] ${method.toUpperCase()} ${route}\n  ${problems.join('\n  ')}\n--- request ---\n${describeRequest(c.request)}\n--- answer ${answer?.status} ${String(answer?.headers['content-type'] ?? '')} ---\n${answer?.text.slice(0, 500) ?? ''}`;
          const knownKey = `${method.toUpperCase()} ${route} ${c.kind}`;
          if (KNOWN_FAILURES[knownKey]) {
            known.push(report);
            continue;
          }
          const group = `${knownKey}: ${problems[0].replace(/\d{3,}|[0-9a-f-]{36}/g, '…')}`;
          const seen = failures.get(group);
          if (seen) seen.times++;
          else failures.set(group, { report, times: 1 });
        }
      }
    }
    // The spread of statuses shows what the run reached; printed so a run's coverage can be read.
    console.log(
      `fuzzed ${sent} requests in ${Date.now() - started} ms, seed ${SEED}, ${RUNS} per operation; known failures: ${known.length}\n` +
        Object.entries(counts)
          .map(([k, n]) => `${k} ×${n}`)
          .join('\n'),
    );
    expect(sent).toBeGreaterThan(0);
    expect([...failures.values()].map(({ report, times }) => `${times}× ${report}`).join('\n\n')).toBe('');
  });
});
