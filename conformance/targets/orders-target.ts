/**
 * The kit's own targets: a small order API on PostgreSQL (node:http and pg, no framework) in one of three designs, each
 * correct but for one fault the kit must find (docs/conformance.md#the-kits-own-targets):
 *   TARGET_DESIGN=key-after-commit  the key is claimed, the order committed in the handler's own transaction, and the
 *                                   answer recorded after it: the design of the SQL stores that wrap a handler. A kill
 *                                   between the two leaves an order and a claim; once the claim lapses, the retry
 *                                   orders again. Found by crash-after-effect, every time.
 *   TARGET_DESIGN=route-key         the key, the order and the answer in one transaction (atomic), but the key is
 *                                   looked up by method + path + key alone: another caller's key is a replay of the
 *                                   first caller's answer. Found by other-caller-own-effect.
 *   TARGET_DESIGN=forget-on-restart the order in PostgreSQL, the keys and their answers in the process's memory: a
 *                                   restart forgets every key, and each retry orders again. Found by both crash checks.
 *   node dist/conformance/targets/orders-target.js   (DATABASE_URL, PORT, TARGET_DESIGN; CONFORMANCE_HOOKS=1 for Conformance-Hold)
 */
import { createHash, randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';

type Design = 'key-after-commit' | 'route-key' | 'forget-on-restart';
const design = process.env.TARGET_DESIGN as Design;
if (design !== 'key-after-commit' && design !== 'route-key' && design !== 'forget-on-restart')
  throw new Error('TARGET_DESIGN must be key-after-commit, route-key or forget-on-restart');
const hooks = process.env.CONFORMANCE_HOOKS === '1';
/** How long a claim of key-after-commit keeps other requests out (its lease): a crashed request's key is free after it. */
const CLAIM_SECONDS = 5;

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 10 });
await pool.query(`
  CREATE TABLE IF NOT EXISTS orders (
    id uuid PRIMARY KEY, client_id text NOT NULL, currency text NOT NULL, items jsonb NOT NULL, total_minor bigint NOT NULL
  );
  -- One row per key in its scope: the primary key is what makes a concurrent duplicate wait or fail.
  CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope text NOT NULL, key text NOT NULL, fingerprint text NOT NULL, locked_until timestamptz,
    status int, headers jsonb, body text, PRIMARY KEY (scope, key)
  );`);

interface Reply {
  status: number;
  headers: Record<string, string>;
  body: string;
}

const problem = (status: number, title: string): Reply => ({
  status,
  headers: { 'content-type': 'application/problem+json' },
  body: JSON.stringify({ type: 'about:blank', title, status }),
});

function canonical(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`;
  if (typeof value === 'object' && value !== null) {
    return `{${Object.keys(value)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical((value as Record<string, unknown>)[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(value);
}

interface OrderInput {
  currency: string;
  items: { sku: string; quantity: number; unitPriceMinor: number }[];
}

function validOrder(body: unknown): OrderInput | undefined {
  const b = body as Partial<OrderInput> | null;
  if (typeof b !== 'object' || b === null || typeof b.currency !== 'string' || !/^[A-Z]{3}$/.test(b.currency)) return undefined;
  if (!Array.isArray(b.items) || b.items.length === 0) return undefined;
  const ok = b.items.every(
    (i) =>
      typeof i?.sku === 'string' &&
      Number.isInteger(i.quantity) &&
      i.quantity > 0 &&
      Number.isInteger(i.unitPriceMinor) &&
      i.unitPriceMinor >= 0,
  );
  return ok ? (b as OrderInput) : undefined;
}

/** 1 to 255 visible ASCII characters, bare (no comma: two merged headers) or an RFC 8941 string. */
function parseKey(lines: string[] | undefined): string | Reply {
  if (!lines || lines.length === 0) return problem(400, 'Idempotency-Key is required');
  if (lines.length > 1) return problem(400, 'One Idempotency-Key, please');
  const raw = lines[0].trim();
  const quoted = /^"(.*)"$/.exec(raw);
  const key = quoted ? quoted[1] : raw;
  if (!/^[\x21-\x7e]{1,255}$/.test(key) || (!quoted && key.includes(','))) return problem(400, 'Idempotency-Key is malformed');
  return key;
}

interface KeyRow {
  fingerprint: string;
  status: number | null;
  headers: Record<string, string>;
  body: string;
  wait?: number;
}

const replayed = (row: KeyRow): Reply => ({
  status: row.status!,
  headers: { ...row.headers, 'idempotent-replayed': 'true' },
  body: row.body,
});

async function insertOrder(db: pg.PoolClient, clientId: string, order: OrderInput): Promise<Reply> {
  const id = randomUUID();
  const total = order.items.reduce((sum, i) => sum + i.quantity * i.unitPriceMinor, 0);
  await db.query('INSERT INTO orders (id, client_id, currency, items, total_minor) VALUES ($1, $2, $3, $4, $5)', [
    id,
    clientId,
    order.currency,
    JSON.stringify(order.items),
    total,
  ]);
  return {
    status: 201,
    headers: { 'content-type': 'application/json', location: `/orders/${id}`, etag: '"1"' },
    body: JSON.stringify({ id, currency: order.currency, items: order.items, totalMinor: total }),
  };
}

/**
 * The conformance hook: after the effect is written, wait. route-key says so with a 102; key-after-commit says
 * nothing, its order being visible already (the kit sees it counted): the two ways the kit learns it is there.
 */
async function hold(req: IncomingMessage, res: ServerResponse): Promise<void> {
  const ms = Number(req.headers['conformance-hold']);
  if (!hooks || !(ms > 0)) return;
  if (design !== 'key-after-commit') res.writeProcessing();
  await sleep(Math.min(ms, 60_000));
}

async function create(req: IncomingMessage, res: ServerResponse, clientId: string, text: string): Promise<Reply> {
  const key = parseKey(req.headersDistinct['idempotency-key']);
  if (typeof key !== 'string') return key;
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    return problem(400, 'The body is not JSON');
  }
  const order = validOrder(body);
  // Refused before the key is touched: a 400 is never stored.
  if (!order) return problem(400, 'Invalid order');
  const fingerprint = createHash('sha256').update(canonical(body)).digest('hex');
  // THE FAULT of route-key: the scope names the route, not the caller.
  const scope = design === 'route-key' ? 'POST /orders' : `${clientId} POST /orders`;
  if (design === 'forget-on-restart') return inMemoryKeys(scope, key, fingerprint, order, clientId, req, res);
  const db = await pool.connect();
  try {
    return design === 'route-key'
      ? await atomic(db, scope, key, fingerprint, order, clientId, req, res)
      : await keyAfterCommit(db, scope, key, fingerprint, order, clientId, req, res);
  } finally {
    db.release();
  }
}

/** route-key: lock the key, look it up, order, record the answer, all in one transaction: a kill leaves nothing. */
async function atomic(
  db: pg.PoolClient,
  scope: string,
  key: string,
  fingerprint: string,
  order: OrderInput,
  clientId: string,
  req: IncomingMessage,
  res: ServerResponse,
): Promise<Reply> {
  await db.query('BEGIN');
  try {
    await db.query('SELECT pg_advisory_xact_lock(hashtextextended($1, 0))', [`${scope} ${key}`]);
    const { rows } = await db.query<KeyRow>(
      'SELECT fingerprint, status, headers, body FROM idempotency_keys WHERE scope = $1 AND key = $2',
      [scope, key],
    );
    if (rows[0]) {
      await db.query('ROLLBACK');
      return rows[0].fingerprint === fingerprint ? replayed(rows[0]) : problem(422, 'Idempotency-Key is already used with another body');
    }
    const reply = await insertOrder(db, clientId, order);
    await hold(req, res);
    await db.query('INSERT INTO idempotency_keys (scope, key, fingerprint, status, headers, body) VALUES ($1, $2, $3, $4, $5, $6)', [
      scope,
      key,
      fingerprint,
      reply.status,
      reply.headers,
      reply.body,
    ]);
    await db.query('COMMIT');
    return reply;
  } catch (err) {
    await db.query('ROLLBACK');
    throw err;
  }
}

/** key-after-commit: claim the key (its own commit), run the handler (its own transaction), then record the answer. */
async function keyAfterCommit(
  db: pg.PoolClient,
  scope: string,
  key: string,
  fingerprint: string,
  order: OrderInput,
  clientId: string,
  req: IncomingMessage,
  res: ServerResponse,
): Promise<Reply> {
  const claimed = await db.query(
    `INSERT INTO idempotency_keys (scope, key, fingerprint, locked_until) VALUES ($1, $2, $3, now() + make_interval(secs => $4))
     ON CONFLICT (scope, key) DO UPDATE SET locked_until = EXCLUDED.locked_until
       WHERE idempotency_keys.status IS NULL AND idempotency_keys.locked_until <= now() AND idempotency_keys.fingerprint = EXCLUDED.fingerprint
     RETURNING 1`,
    [scope, key, fingerprint, CLAIM_SECONDS],
  );
  if (claimed.rowCount === 0) {
    const { rows } = await db.query<KeyRow>(
      'SELECT fingerprint, status, headers, body, ceil(extract(epoch FROM locked_until - now()))::int AS wait FROM idempotency_keys WHERE scope = $1 AND key = $2',
      [scope, key],
    );
    if (rows[0].fingerprint !== fingerprint) return problem(422, 'Idempotency-Key is already used with another body');
    if (rows[0].status !== null) return replayed(rows[0]);
    const busy = problem(409, 'A request with this Idempotency-Key is in progress');
    return { ...busy, headers: { ...busy.headers, 'retry-after': String(Math.max(rows[0].wait ?? 1, 1)) } };
  }
  let reply: Reply;
  try {
    await db.query('BEGIN');
    reply = await insertOrder(db, clientId, order);
    await db.query('COMMIT');
  } catch (err) {
    await db.query('ROLLBACK');
    // A failure is not stored: the claim goes, and the retry runs.
    await db.query('DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2', [scope, key]);
    throw err;
  }
  // THE FAULT of key-after-commit: the order is committed; the answer is recorded only now, in another statement.
  await hold(req, res);
  await db.query('UPDATE idempotency_keys SET status = $3, headers = $4, body = $5, locked_until = NULL WHERE scope = $1 AND key = $2', [
    scope,
    key,
    reply.status,
    reply.headers,
    reply.body,
  ]);
  return reply;
}

/** forget-on-restart's key store: this process's memory. `undefined` reply: a request with the key is in progress. */
const keysInMemory = new Map<string, { fingerprint: string; reply?: Reply }>();

/** forget-on-restart: the key claimed and its answer kept in memory, the order committed in PostgreSQL. */
async function inMemoryKeys(
  scope: string,
  key: string,
  fingerprint: string,
  order: OrderInput,
  clientId: string,
  req: IncomingMessage,
  res: ServerResponse,
): Promise<Reply> {
  const id = `${scope} ${key}`;
  const known = keysInMemory.get(id);
  if (known) {
    if (known.fingerprint !== fingerprint) return problem(422, 'Idempotency-Key is already used with another body');
    if (known.reply) return { ...known.reply, headers: { ...known.reply.headers, 'idempotent-replayed': 'true' } };
    const busy = problem(409, 'A request with this Idempotency-Key is in progress');
    return { ...busy, headers: { ...busy.headers, 'retry-after': '1' } };
  }
  keysInMemory.set(id, { fingerprint });
  const db = await pool.connect();
  let reply: Reply;
  try {
    reply = await insertOrder(db, clientId, order);
  } catch (err) {
    keysInMemory.delete(id);
    throw err;
  } finally {
    db.release();
  }
  await hold(req, res);
  // THE FAULT of forget-on-restart: the answer lives only as long as this process.
  keysInMemory.set(id, { fingerprint, reply });
  return reply;
}

const OPENAPI = {
  openapi: '3.0.3',
  info: { title: 'conformance target', version: '1' },
  paths: {
    '/orders': {
      post: {
        parameters: [
          { in: 'header', name: 'Idempotency-Key', required: true, schema: { type: 'string' }, description: 'Keys expire after 24 hours.' },
        ],
        responses: { 201: { description: 'Created' } },
      },
    },
  },
};

async function route(req: IncomingMessage, res: ServerResponse, text: string): Promise<Reply> {
  const path = (req.url ?? '/').split('?')[0];
  if (req.method === 'GET' && path === '/docs-json')
    return { status: 200, headers: { 'content-type': 'application/json' }, body: JSON.stringify(OPENAPI) };
  if (req.method === 'GET' && path === '/ping') return { status: 200, headers: { 'content-type': 'text/plain' }, body: 'ok' };
  const clientId = /^Bearer (\S+)$/.exec(req.headers.authorization ?? '')?.[1];
  if (!clientId) return problem(401, 'Unauthorized');
  if (req.method === 'POST' && path === '/orders') return create(req, res, clientId, text);
  if (req.method === 'GET' && path === '/orders') {
    const { rows } = await pool.query('SELECT id FROM orders WHERE client_id = $1', [clientId]);
    return { status: 200, headers: { 'content-type': 'application/json' }, body: JSON.stringify({ items: rows }) };
  }
  return problem(404, 'Not Found');
}

const server = createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    route(req, res, Buffer.concat(chunks).toString('utf8'))
      .catch((err: Error) => {
        console.error(err);
        return problem(500, 'Internal Server Error');
      })
      .then(
        (reply) => res.writeHead(reply.status, reply.headers).end(reply.body),
        () => res.destroy(),
      );
  });
});
server.listen(Number(process.env.PORT ?? 0), '127.0.0.1', () =>
  console.log(`listening on http://localhost:${(server.address() as { port: number }).port}`),
);
