import { randomBytes, randomUUID } from 'node:crypto';
import { defaultProblemType } from './idempotency-key-header.js';
import type { StoredResponse } from './idempotency-keys.service.js';
import { ProblemDetailsException } from './problem-details.js';
import { ReplayCache } from './replay-cache.js';
import { type AnswerRow, resolveResponseEncryption, StoredResponseCipher } from './stored-response-cipher.js';

const k1 = randomBytes(32);
const k2 = randomBytes(32);
const cipherWith = (keys: Record<string, Buffer | string>, current: string) =>
  new StoredResponseCipher(resolveResponseEncryption({ keys, current }), defaultProblemType);

const answer: StoredResponse = {
  status: 201,
  headers: { 'content-type': 'application/json; charset=utf-8', location: '/orders/1', etag: '"1"' },
  body: JSON.stringify({ id: '1', shippingAddress: { name: 'Ada Lovelace', line1: '12 St James Square' }, note: 'née Byron ✓' }),
};

/** The row a statement would read back after writing `columns` under `id`. */
const rowOf = (id: string, cipher: StoredResponseCipher, response = answer): AnswerRow => {
  const c = cipher.columnsOf(id, response);
  return {
    id,
    response_status: c.status,
    response_headers: c.headers,
    response_body: c.body,
    response_key_id: c.keyId,
    response_sealed: c.sealed,
  };
};

/** The 503 problem a refused envelope becomes (thrown), or undefined when it opened. */
const refusal = (open: () => unknown): ProblemDetailsException | undefined => {
  try {
    open();
    return undefined;
  } catch (err) {
    if (err instanceof ProblemDetailsException) return err;
    throw err;
  }
};

describe('StoredResponseCipher: the envelope of a stored answer', () => {
  it('seals the whole answer (status, headers, body) and opens it byte for byte; the plain columns hold only a placeholder', () => {
    const cipher = cipherWith({ k1 }, 'k1');
    const row = rowOf(randomUUID(), cipher);
    expect(row.response_key_id).toBe('k1');
    const stored = JSON.stringify([row.response_status, row.response_headers, row.response_body]) + row.response_sealed!.toString('latin1');
    for (const plain of ['Ada Lovelace', 'St James', '/orders/1', 'Byron']) expect(stored).not.toContain(plain);
    expect(row.response_status).toBe(503);
    expect(cipher.responseOf(row)).toEqual(answer);
  });

  it('uses a fresh IV per seal: the same answer twice is two different envelopes', () => {
    const cipher = cipherWith({ k1 }, 'k1');
    const id = randomUUID();
    expect(rowOf(id, cipher).response_sealed!.equals(rowOf(id, cipher).response_sealed!)).toBe(false);
  });

  it('refuses a tampered envelope (any byte of IV, tag or ciphertext) with a 503 problem', () => {
    const cipher = cipherWith({ k1 }, 'k1');
    const row = rowOf(randomUUID(), cipher);
    for (const at of [1, 13, 29, row.response_sealed!.length - 1]) {
      const sealed = Buffer.from(row.response_sealed!);
      sealed[at] ^= 0x01;
      const refused = refusal(() => cipher.responseOf({ ...row, response_sealed: sealed }));
      expect(refused?.problem).toMatchObject({ status: 503, title: 'The stored answer cannot be read' });
    }
    expect(refusal(() => cipher.responseOf({ ...row, response_sealed: row.response_sealed!.subarray(0, 20) }))?.getStatus()).toBe(503);
  });

  it("refuses an answer moved to another key's row", () => {
    const cipher = cipherWith({ k1 }, 'k1');
    const row = rowOf(randomUUID(), cipher);
    const refused = refusal(() => cipher.responseOf({ ...row, id: randomUUID() }));
    expect(refused?.problem.detail).toMatch(/does not authenticate under encryption key "k1"/);
  });

  it('refuses an answer relabelled with another key id, even one the server holds', () => {
    const cipher = cipherWith({ k2, k1 }, 'k2');
    const row = rowOf(randomUUID(), cipher);
    expect(refusal(() => cipher.responseOf({ ...row, response_key_id: 'k1' }))?.getStatus()).toBe(503);
  });

  it('after a rotation, reads what the old key sealed and seals with the new one', () => {
    const id = randomUUID();
    const before = rowOf(id, cipherWith({ k1 }, 'k1'));
    const rotated = cipherWith({ k2, k1 }, 'k2');
    expect(rotated.responseOf(before)).toEqual(answer);
    expect(rowOf(id, rotated).response_key_id).toBe('k2');
  });

  it('an unknown key id is a clear 503 that names it, and so is a sealed answer with encryption turned off', () => {
    const row = rowOf(randomUUID(), cipherWith({ k1 }, 'k1'));
    const refused = refusal(() => cipherWith({ k2 }, 'k2').responseOf(row));
    expect(refused?.problem).toMatchObject({
      type: defaultProblemType('stored-answer-unreadable'),
      status: 503,
      detail: expect.stringContaining('sealed with encryption key "k1", which this server does not hold') as string,
    });
    expect(refused?.problem.detail).toContain('The request was not run again');
    expect(refusal(() => new StoredResponseCipher(false, defaultProblemType).responseOf(row))?.getStatus()).toBe(503);
  });

  it('off: the answer is stored and read in plain, as before', () => {
    const cipher = new StoredResponseCipher(false, defaultProblemType);
    const row = rowOf(randomUUID(), cipher);
    expect(row).toMatchObject({ response_status: 201, response_body: answer.body, response_key_id: null, response_sealed: null });
    expect(cipher.responseOf(row)).toEqual(answer);
    // A row written in plain (by an older build, or before encryption was on) is read by a cipher that is on.
    expect(cipherWith({ k1 }, 'k1').responseOf(row)).toEqual(answer);
  });
});

describe('resolveResponseEncryption: validated when the options are resolved', () => {
  it.each([
    [{ keys: { k1: randomBytes(16) }, current: 'k1' }, /responseEncryption\.keys\.k1 must be 32 random bytes .* got 16 bytes/],
    [{ keys: { k1: 'not base64!' }, current: 'k1' }, /responseEncryption\.keys\.k1 .* got neither a Buffer nor base64/],
    [{ keys: { k1: randomBytes(32).toString('base64').slice(0, 40) }, current: 'k1' }, /responseEncryption\.keys\.k1 must be 32/],
    [{ keys: { 'k:1': k1 }, current: 'k:1' }, /responseEncryption\.keys: the key id "k:1"/],
    [{ keys: {}, current: 'k1' }, /responseEncryption\.keys must hold at least one key/],
    [{ keys: { k1 }, current: 'k2' }, /responseEncryption\.current must name one of responseEncryption\.keys \(k1\): got "k2"/],
  ])('refuses %p, naming the option', (option, message) => {
    expect(() => resolveResponseEncryption(option)).toThrow(message);
  });

  it('never prints a key, even a malformed one', () => {
    const short = randomBytes(31).toString('base64');
    expect(() => resolveResponseEncryption({ keys: { k1: short }, current: 'k1' })).toThrow(/k1/);
    try {
      resolveResponseEncryption({ keys: { k1: short }, current: 'k1' });
    } catch (err) {
      expect((err as Error).message).not.toContain(short);
    }
  });

  it('accepts a Buffer or base64, and is off when not given', () => {
    expect(resolveResponseEncryption({ keys: { k1, k2: k2.toString('base64') }, current: 'k2' })).toMatchObject({ current: 'k2' });
    expect(resolveResponseEncryption(undefined)).toBe(false);
    expect(resolveResponseEncryption(false)).toBe(false);
  });
});

describe('ReplayCache with encryption on', () => {
  it('keeps only the sealed answer in memory and gives back the exact answer', () => {
    const cache = new ReplayCache(10, 1_000_000, () => ({ monotonic: 0, wall: 0 }), cipherWith({ k1 }, 'k1'));
    cache.remember('alice', 'key-1', { fingerprint: 'f', response: answer }, 60_000, { monotonic: 0, wall: 0 });
    const entries = (cache as unknown as { entries: Map<string, { response: unknown }> }).entries;
    const kept = JSON.stringify([...entries.values()].map((e) => e.response));
    expect(kept).not.toContain('Lovelace');
    expect(cache.get('alice', 'key-1')).toEqual({ fingerprint: 'f', response: answer });
  });
});
