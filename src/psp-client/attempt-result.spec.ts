import { describeAttempt, isRetryable, isRetryableStatus, judgeLookup, judgeWrite, readListing, readLookup } from './attempt-result.js';

const isRecord = (b: unknown): b is { status: string } =>
  typeof b === 'object' && b !== null && typeof (b as { id?: unknown }).id === 'string';

describe('isRetryableStatus', () => {
  it('retries 409, 429 and 5xx only', () => {
    for (const s of [409, 429, 500, 502, 503, 504, 599]) expect(isRetryableStatus(s)).toBe(true);
    for (const s of [200, 201, 301, 400, 401, 402, 403, 404, 422, 600]) expect(isRetryableStatus(s)).toBe(false);
  });

  it('retries timeouts and network errors, never a skipped attempt', () => {
    expect(isRetryable({ kind: 'timeout', message: '', verdict: 'unknown' })).toBe(true);
    expect(isRetryable({ kind: 'network', message: '', verdict: 'unknown' })).toBe(true);
    expect(isRetryable({ kind: 'skipped', verdict: 'unknown' })).toBe(false);
  });
});

describe('judgeWrite', () => {
  it('is definitive for a 201 succeeded record and a 402 failed record', () => {
    expect(judgeWrite(201, { id: 'ch_1', status: 'succeeded' }, isRecord)).toBe('definitive');
    expect(judgeWrite(402, { id: 'ch_1', status: 'failed' }, isRecord)).toBe('definitive');
  });

  it('is unknown when a 201 or 402 does not carry the record it should', () => {
    expect(judgeWrite(201, undefined, isRecord)).toBe('unknown');
    expect(judgeWrite(201, { id: 'ch_1', status: 'failed' }, isRecord)).toBe('unknown');
    expect(judgeWrite(402, { type: 'about:blank', status: 402 }, isRecord)).toBe('unknown');
  });

  it('is refused for 400, 404 and 422, unknown for the rest', () => {
    for (const s of [400, 404, 422]) expect(judgeWrite(s, {}, isRecord)).toBe('refused');
    for (const s of [200, 302, 401, 403, 409, 429, 500, 503]) expect(judgeWrite(s, {}, isRecord)).toBe('unknown');
  });
});

describe('judgeLookup', () => {
  const lookup = (body: unknown) => readLookup(body, isRecord);

  it('takes an empty list as an answer and an unreadable one as none', () => {
    expect(judgeLookup(200, { items: [] }, lookup)).toBe('definitive');
    expect(judgeLookup(200, { items: [{ id: 'ch_1' }] }, lookup)).toBe('definitive');
    expect(judgeLookup(200, { items: [{}] }, lookup)).toBe('unknown');
    expect(judgeLookup(200, {}, lookup)).toBe('unknown');
    expect(judgeLookup(200, undefined, lookup)).toBe('unknown');
    expect(judgeLookup(503, { items: [] }, lookup)).toBe('unknown');
    expect(judgeLookup(400, {}, lookup)).toBe('refused');
  });
});

describe('readLookup and readListing', () => {
  it('a lookup by id reads its items and never hasMore; a page of a listing must say hasMore', () => {
    expect(readLookup({ items: [{ id: 'ch_1' }], hasMore: true }, isRecord)).toEqual({ items: [{ id: 'ch_1' }], hasMore: false });
    expect(readListing({ items: [{ id: 'ch_1' }], hasMore: true }, isRecord)).toEqual({ items: [{ id: 'ch_1' }], hasMore: true });
    expect(readListing({ items: [], hasMore: false }, isRecord)).toEqual({ items: [], hasMore: false });
    for (const body of [
      { items: [] },
      { items: [], hasMore: 'false' },
      { items: [{}], hasMore: false },
      { hasMore: false },
      null,
      undefined,
    ])
      expect(readListing(body, isRecord)).toBeUndefined();
  });
});

describe('describeAttempt', () => {
  it('names what an attempt ended with', () => {
    expect(describeAttempt(undefined)).toBe('no attempt was made');
    expect(describeAttempt({ kind: 'response', status: 503, body: undefined, retryAfterMs: undefined, verdict: 'unknown' })).toBe(
      'HTTP 503',
    );
    expect(describeAttempt({ kind: 'timeout', message: 'no answer within 150 ms', verdict: 'unknown' })).toBe(
      'timeout: no answer within 150 ms',
    );
  });
});
