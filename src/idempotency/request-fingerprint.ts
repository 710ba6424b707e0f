import { createHash } from 'node:crypto';

/**
 * JSON with object keys sorted at every depth and no whitespace: two bodies that mean the same
 * thing serialise the same, whatever order the client wrote the keys in. Array order is meaning.
 */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value) ?? 'null';
  if (Array.isArray(value)) return `[${value.map((v) => (v === undefined ? 'null' : canonicalJson(v))).join(',')}]`;
  const entries = Object.entries(value as Record<string, unknown>)
    .filter(([, v]) => v !== undefined)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(',')}}`;
}

/** Paths name one endpoint however they are spelled: Express routes ignore case and a trailing slash. */
export function normalisePath(path: string): string {
  const lower = path.toLowerCase();
  return lower.length > 1 && lower.endsWith('/') ? lower.slice(0, -1) : lower;
}

/**
 * What a key is bound to: method, endpoint and meaning of the body. Reusing a key for anything
 * else is a client bug, answered with 422 instead of replaying a response to another request.
 */
export function fingerprintRequest(method: string, path: string, body: unknown): string {
  return createHash('sha256')
    .update(`${method.toUpperCase()}\n${normalisePath(path)}\n${canonicalJson(body ?? null)}`)
    .digest('hex');
}
