import { parseIdempotencyKey } from './idempotency-key-header.js';

describe('parseIdempotencyKey', () => {
  it.each([
    ['8e03978e-40d5-43e8-bc93-6894a57f9324', '8e03978e-40d5-43e8-bc93-6894a57f9324'],
    ['abc', 'abc'],
    ['"abc"', 'abc'],
    ['  abc  ', 'abc'],
    ['"esc\\"aped"', 'esc"aped'],
    ['x'.repeat(255), 'x'.repeat(255)],
    ['~!#$%&*+-.^_|', '~!#$%&*+-.^_|'],
    // Quoted, a comma is part of the one string.
    ['"key,with,commas"', 'key,with,commas'],
  ])('accepts %j as %j', (raw, key) => {
    expect(parseIdempotencyKey(raw)).toBe(key);
  });

  it('treats the quoted and bare forms as one key', () => {
    expect(parseIdempotencyKey('"k-1"')).toBe(parseIdempotencyKey('k-1'));
  });

  it.each([
    ['empty', ''],
    ['blank', '   '],
    ['too long', 'x'.repeat(256)],
    ['quoted, too long', `"${'x'.repeat(256)}"`],
    ['inner space', 'a b'],
    ['quoted, inner space', '"a b"'],
    ['quoted, only a space', '" "'],
    ['two values', 'a, b'],
    // What a proxy makes of two headers merged into one; the draft's sf-string needs quotes around a comma.
    ['bare commas', 'key,with,commas'],
    ['a trailing comma', 'abc,'],
    ['non-ASCII', 'clé'],
    ['control character', 'a\tb'],
    ['empty quoted string', '""'],
    ['unterminated quote', '"abc'],
    ['parameters', '"abc";p=1'],
    ['a list', '"a", "b"'],
  ])('rejects %s', (_, raw) => {
    expect(() => parseIdempotencyKey(raw)).toThrow(expect.objectContaining({ problem: expect.objectContaining({ status: 400 }) }));
  });

  it('rejects a repeated header', () => {
    expect(() => parseIdempotencyKey(['a', 'a'])).toThrow(expect.objectContaining({ problem: expect.objectContaining({ status: 400 }) }));
  });
});
