/**
 * JSON with object keys sorted at every depth and no whitespace: two values that mean the same
 * thing serialise the same, whatever order the keys were written in. Array order is meaning and
 * is kept. Members whose value is undefined are dropped (as JSON.stringify drops them); an
 * undefined array element becomes null (as JSON.stringify writes it).
 *
 * The service's canonical form: the stored shipping address and an order's creation digest go through it. Its
 * bytes are part of stored data: change them and those stop matching. (The idempotency package keeps its own
 * copy for key fingerprints, internal to it: the two must not drift, and neither may change.)
 *
 * Recursive: callers pass request bodies, whose depth the app's body parser must bound.
 */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value) ?? 'null';
  // Loops and one string rather than entries/filter/sort/map/join arrays at every level: half the CPU, the same bytes
  // (canonical-json.spec.ts holds it to the earlier form on generated values). It runs twice per create.
  if (Array.isArray(value)) {
    let out = '[';
    for (let i = 0; i < value.length; i++) {
      if (i > 0) out += ',';
      // A hole stays empty, as map() + join() wrote it; JSON bodies have none.
      if (i in value) out += value[i] === undefined ? 'null' : canonicalJson(value[i]);
    }
    return `${out}]`;
  }
  const object = value as Record<string, unknown>;
  let members = '';
  // sort() without a comparator orders by code unit, not locale: the same on every machine.
  for (const key of Object.keys(object).sort()) {
    const member = object[key];
    if (member === undefined) continue;
    members += `${members ? ',' : ''}${JSON.stringify(key)}:${canonicalJson(member)}`;
  }
  return `{${members}}`;
}
