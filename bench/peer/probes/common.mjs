// Shared by the probes. Each probe runs against TARGET=peer|ours at
// APP_URL, counts rows in DATABASE_URL, and prints one human line plus one "PROBE {json}" line for probes.mjs.
import crypto from 'node:crypto';
import pg from 'pg';
import { OURS_CLIENTS } from '../lib.mjs';

export const rid = (n = 4) => crypto.randomBytes(n).toString('hex');
export const arg = (n, d) => {
  const i = process.argv.indexOf(`--${n}`);
  return i > 0 ? process.argv[i + 1] : d;
};
export const TARGET = process.env.TARGET ?? 'peer';
export const APP_URL = () => process.env.APP_URL;
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * A client of the target. The peer's guard takes the bearer token as the client id (no verification); our
 * service maps a secret to a client id (API_KEYS, set by lib.mjs startOurs).
 */
export function client(name) {
  if (TARGET === 'ours') return { token: OURS_CLIENTS[name], clientId: name };
  const id = `${name}-${rid()}`;
  return { token: id, clientId: id };
}

// POST /orders; body may be an object or a raw JSON string (to control key order / whitespace)
export async function postOrder({ url = APP_URL(), key, token, body }) {
  const headers = { 'content-type': 'application/json' };
  if (key !== undefined) headers['idempotency-key'] = key;
  if (token !== undefined) headers.authorization = `Bearer ${token}`;
  try {
    const r = await fetch(url + '/orders', {
      method: 'POST',
      headers,
      body: typeof body === 'string' ? body : JSON.stringify(body),
      signal: AbortSignal.timeout(30_000),
    });
    const text = await r.text();
    let json;
    try {
      json = JSON.parse(text);
    } catch {
      json = text;
    }
    return { status: r.status, replayed: r.headers.get('idempotent-replayed') === 'true', json };
  } catch (e) {
    return { status: 'conn-error', error: e.cause?.code ?? e.message };
  }
}

export function histogram(results) {
  const h = {};
  for (const r of results) {
    const k = `${r.status}${r.replayed ? ' replayed' : ''}`;
    h[k] = (h[k] ?? 0) + 1;
  }
  return h;
}

let conn;
export async function db() {
  if (!conn) {
    conn = new pg.Client({ connectionString: process.env.DATABASE_URL });
    await conn.connect();
  }
  return conn;
}
export async function closeDb() {
  if (conn) await conn.end();
  conn = undefined;
}
export async function ordersFor(clientId) {
  const c = await db();
  return (await c.query('SELECT count(*)::int AS n FROM orders WHERE client_id = $1', [clientId])).rows[0].n;
}
export const items = (tag = 'sku') => [
  { sku: `${tag}-1`, quantity: 2, unitPriceMinor: 1500 },
  { sku: `${tag}-2`, quantity: 1, unitPriceMinor: 999 },
];
/** message (peer) or detail/title (our problem+json) of an error response. */
export const why = (r) => (typeof r.json === 'object' && r.json ? (r.json.message ?? r.json.title ?? '') : '');
export function report(name, summary, detail) {
  console.log(`${name} [${TARGET}]: ${summary}`);
  console.log('PROBE ' + JSON.stringify({ probe: name, target: TARGET, ...detail }));
}
