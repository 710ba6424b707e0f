import fc from 'fast-check';
import { canonicalJson } from './canonical-json.js';

/** The form before it was rewritten with loops: its bytes are in stored fingerprints, so the rewrite must match it. */
function earlierCanonicalJson(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value) ?? 'null';
  if (Array.isArray(value)) return `[${value.map((v) => (v === undefined ? 'null' : earlierCanonicalJson(v))).join(',')}]`;
  const entries = Object.entries(value as Record<string, unknown>)
    .filter(([, v]) => v !== undefined)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${earlierCanonicalJson(v)}`).join(',')}}`;
}

describe('canonicalJson', () => {
  it('sorts keys at every depth and drops whitespace', () => {
    expect(canonicalJson(JSON.parse('{ "b": 1, "a": { "d": [1, {"y": 2, "x": 1}], "c": null } }'))).toBe(
      '{"a":{"c":null,"d":[1,{"x":1,"y":2}]},"b":1}',
    );
  });

  it('gives the same text for the same value written in any key order', () => {
    const a = JSON.parse('{"currency":"EUR","items":[{"sku":"A","quantity":1}],"note":"n"}');
    const b = JSON.parse('{ "note" : "n", "items" : [ { "quantity" : 1 , "sku" : "A" } ], "currency" : "EUR" }');
    expect(canonicalJson(a)).toBe(canonicalJson(b));
  });

  it('keeps array order, which is meaning', () => {
    expect(canonicalJson([2, 1])).toBe('[2,1]');
    expect(canonicalJson([2, 1])).not.toBe(canonicalJson([1, 2]));
  });

  it('drops undefined members, and writes an undefined array element as null, as JSON.stringify does', () => {
    expect(canonicalJson({ a: 1, b: undefined })).toBe('{"a":1}');
    expect(canonicalJson({ a: 1, b: undefined })).toBe(canonicalJson({ a: 1 }));
    expect(canonicalJson([1, undefined])).toBe('[1,null]');
    expect(canonicalJson(undefined)).toBe('null');
  });

  it('distinguishes values of different types, and null from absent', () => {
    expect(canonicalJson({ a: 1 })).not.toBe(canonicalJson({ a: '1' }));
    expect(canonicalJson({ a: null })).not.toBe(canonicalJson({}));
    expect(canonicalJson({ a: [] })).not.toBe(canonicalJson({ a: {} }));
  });

  it('escapes keys and strings as JSON does, and keeps non-ASCII text as it is', () => {
    expect(canonicalJson({ 'a"b': 'c\nd' })).toBe('{"a\\"b":"c\\nd"}');
    expect(canonicalJson({ k: 'Zoë ✓ \u001f' })).toBe('{"k":"Zoë ✓ \\u001f"}');
  });

  it('sorts keys by code unit, not by locale', () => {
    expect(canonicalJson({ b: 1, B: 2, a: 3, _: 4 })).toBe('{"B":2,"_":4,"a":3,"b":1}');
  });

  it('is valid JSON that parses back to the same value', () => {
    const value = { z: [1, 'two', { y: null, x: true }], a: { nested: { deeper: [[]] } }, n: -1.5e-7 };
    expect(JSON.parse(canonicalJson(value))).toEqual(value);
  });

  it('writes exactly the bytes of its earlier form (stored fingerprints), on any JSON value and with undefined members', () => {
    const withUndefined = fc.letrec((tie) => ({
      value: fc.oneof(
        { depthSize: 'small' },
        fc.jsonValue({ maxDepth: 2 }),
        fc.constant(undefined),
        fc.array(tie('value'), { maxLength: 4 }),
        fc.dictionary(fc.string(), tie('value'), { maxKeys: 5 }),
      ),
    })).value;
    fc.assert(
      fc.property(fc.oneof(fc.jsonValue(), withUndefined), (value) => {
        expect(canonicalJson(value)).toBe(earlierCanonicalJson(value));
      }),
      { numRuns: 2000 },
    );
  });
});
