/**
 * JSON with object keys sorted at every depth and no whitespace: two values that mean the same
 * thing serialise the same, whatever order the keys were written in. Array order is meaning and
 * is kept. Members whose value is undefined are dropped (as JSON.stringify drops them); an
 * undefined array element becomes null (as JSON.stringify writes it).
 *
 * The one canonical form of the service: the Idempotency-Key fingerprint, the stored shipping
 * address and an order's creation digest all go through it. Its bytes are part of stored data
 * (fingerprints of live keys): change them and those stop matching.
 *
 * Recursive: callers pass request bodies, whose depth the app's body parser must bound.
 */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value) ?? 'null';
  if (Array.isArray(value)) return `[${value.map((v) => (v === undefined ? 'null' : canonicalJson(v))).join(',')}]`;
  const entries = Object.entries(value as Record<string, unknown>)
    .filter(([, v]) => v !== undefined)
    // Code-unit order, not localeCompare: the same on every machine, whatever its locale.
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(',')}}`;
}
