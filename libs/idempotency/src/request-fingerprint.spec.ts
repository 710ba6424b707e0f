import { fingerprintRequest } from './request-fingerprint.js';

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

  it('binds the key to the headers a route names: another If-Match is another request', () => {
    const edit = { note: 'n' };
    const base = fingerprintRequest('PATCH', '/orders/1', edit, { 'if-match': '"1"' });
    expect(fingerprintRequest('PATCH', '/orders/1', edit, { 'if-match': '"1"' })).toBe(base);
    expect(fingerprintRequest('PATCH', '/orders/1', edit, { 'if-match': '"2"' })).not.toBe(base);
    expect(fingerprintRequest('PATCH', '/orders/1', edit, { 'if-match': '' })).not.toBe(base);
    expect(fingerprintRequest('PATCH', '/orders/1', edit)).not.toBe(base);
  });

  it('treats a missing body as null', () => {
    expect(fingerprintRequest('POST', '/x', undefined)).toBe(fingerprintRequest('POST', '/x', null));
  });

  it('is stable across releases: keys stored by an earlier build still match their retries', () => {
    // Computed by the build before canonicalJson moved to src/common. If this changes, every
    // in-flight key answers its own retry with 422 until it expires: do not change it lightly.
    const stored = {
      orderNumber: 'PO-1',
      currency: 'EUR',
      items: [{ sku: 'SKU-1', quantity: 2, unitPriceMinor: 1999 }],
      shippingAddress: { name: 'Zoë "Z"', line1: '1 Main St\n', city: 'Paris', postalCode: '75001', country: 'FR' },
      note: 'ring twice ✓',
    };
    expect(fingerprintRequest('POST', '/orders', stored)).toBe('5ab1b2ef8d24dffcb9527e2e6a2f0804d1658e4f7c2e3271b21fc58c17445278');
  });
});
