import { createHash } from 'node:crypto';
import { canonicalJson } from './canonical-json.js';

/** Paths name one endpoint however they are spelled: routes ignore case and a trailing slash (http-app.ts). */
export function normalisePath(path: string): string {
  const lower = path.toLowerCase();
  return lower.length > 1 && lower.endsWith('/') ? lower.slice(0, -1) : lower;
}

/**
 * What a key is bound to: method, endpoint and meaning of the body (its canonical JSON, so key
 * order and whitespace do not count), plus the request headers a route declares part of its
 * meaning (`If-Match` on PATCH: the same edit from another version is another request). Reusing a
 * key for anything else is a client bug, answered with 422 instead of replaying a response to
 * another request. Without such headers the hash is what earlier builds stored.
 */
export function fingerprintRequest(method: string, path: string, body: unknown, headers: Readonly<Record<string, string>> = {}): string {
  const hash = createHash('sha256').update(`${method.toUpperCase()}\n${normalisePath(path)}\n${canonicalJson(body ?? null)}`);
  for (const name of Object.keys(headers).sort()) hash.update(`\n${name.toLowerCase()}: ${headers[name]}`);
  return hash.digest('hex');
}
