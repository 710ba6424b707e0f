import { canonicalJson, fingerprintRequest } from './request-fingerprint.js';

describe('canonicalJson', () => {
  it('sorts keys at every depth and drops whitespace', () => {
    expect(canonicalJson(JSON.parse('{ "b": 1, "a": { "d": [1, {"y": 2, "x": 1}], "c": null } }'))).toBe(
      '{"a":{"c":null,"d":[1,{"x":1,"y":2}]},"b":1}',
    );
  });

  it('keeps array order, which is meaning', () => {
    expect(canonicalJson([2, 1])).not.toBe(canonicalJson([1, 2]));
  });

  it('distinguishes values of different types', () => {
    expect(canonicalJson({ a: 1 })).not.toBe(canonicalJson({ a: '1' }));
    expect(canonicalJson({ a: null })).not.toBe(canonicalJson({}));
  });

  it('escapes keys and strings as JSON does', () => {
    expect(canonicalJson({ 'a"b': 'c\nd' })).toBe('{"a\\"b":"c\\nd"}');
  });
});

describe('fingerprintRequest', () => {
  const body = { currency: 'EUR', items: [{ sku: 'A', quantity: 1, unitPriceMinor: 5 }] };

  it('is the same for the same request written differently', () => {
    const reordered = JSON.parse('{"items":[{"unitPriceMinor":5,"quantity":1,"sku":"A"}],  "currency":"EUR"}');
    expect(fingerprintRequest('POST', '/orders', body)).toBe(fingerprintRequest('post', '/Orders/', reordered));
  });

  it('differs for another body, method or endpoint', () => {
    const base = fingerprintRequest('POST', '/orders', body);
    expect(fingerprintRequest('POST', '/orders', { ...body, currency: 'USD' })).not.toBe(base);
    expect(fingerprintRequest('PUT', '/orders', body)).not.toBe(base);
    expect(fingerprintRequest('POST', '/orders/1/cancel', body)).not.toBe(base);
  });

  it('treats a missing body as null', () => {
    expect(fingerprintRequest('POST', '/x', undefined)).toBe(fingerprintRequest('POST', '/x', null));
  });
});
