import { type ClockReading, REPLAY_CACHE_EXPIRY_MARGIN_MS, ReplayCache } from './replay-cache.js';

const answer = (body: string) => ({ fingerprint: 'f1', response: { status: 201, headers: { 'content-type': 'application/json' }, body } });

describe('ReplayCache', () => {
  // Both clocks advance together unless a test moves one alone.
  let clock = 0;
  let wallOffset = 0;
  const now = (): ClockReading => ({ monotonic: clock, wall: clock + wallOffset });
  beforeEach(() => {
    clock = 1_000;
    wallOffset = 1_700_000_000_000;
  });

  it('answers a remembered key until the margin before its expiry, then never again', () => {
    const cache = new ReplayCache(10, 1_000_000, now);
    cache.remember('alice', 'k', answer('{"id":1}'), 60_000, now());
    expect(cache.get('alice', 'k')).toEqual(answer('{"id":1}'));
    clock += 60_000 - REPLAY_CACHE_EXPIRY_MARGIN_MS - 1;
    expect(cache.get('alice', 'k')?.response.body).toBe('{"id":1}');
    clock += 1;
    expect(cache.get('alice', 'k')).toBeUndefined();
    expect(cache.size).toBe(0);
  });

  it('counts from when the reading statement was sent, and ends when either clock runs out', () => {
    const cache = new ReplayCache(10, 1_000_000, now);
    const sentAt = now();
    clock += 30_000; // the answer took 30 s to come back: those 30 s are already gone from the key's life
    cache.remember('alice', 'k', answer('{}'), 60_000, sentAt);
    clock += 30_000 - REPLAY_CACHE_EXPIRY_MARGIN_MS;
    expect(cache.get('alice', 'k')).toBeUndefined();

    cache.remember('alice', 'suspended', answer('{}'), 60_000, now());
    wallOffset += 60_000; // the host slept a minute: the monotonic clock did not count it, the wall clock did
    expect(cache.get('alice', 'suspended')).toBeUndefined();

    cache.remember('alice', 'stepped', answer('{}'), 60_000, now());
    wallOffset -= 3_600_000; // the wall clock was set back an hour: the monotonic clock still counts
    clock += 60_000;
    expect(cache.get('alice', 'stepped')).toBeUndefined();
  });

  it('does not keep a key with less life left than the margin', () => {
    const cache = new ReplayCache(10, 1_000_000, now);
    cache.remember('alice', 'k', answer('{}'), REPLAY_CACHE_EXPIRY_MARGIN_MS, now());
    expect(cache.get('alice', 'k')).toBeUndefined();
  });

  it("scopes keys to their client: one client's key never answers another's request", () => {
    const cache = new ReplayCache(10, 1_000_000, now);
    cache.remember('alice', 'k', answer('{"of":"alice"}'), 60_000, now());
    expect(cache.get('bob', 'k')).toBeUndefined();
    // The separator cannot be forged from the parts: a client id never contains a newline.
    expect(cache.get('alice\nk', '')).toBeUndefined();
  });

  it('drops the least recently used key beyond maxEntries', () => {
    const cache = new ReplayCache(2, 1_000_000, now);
    cache.remember('alice', 'a', answer('a'), 60_000, now());
    cache.remember('alice', 'b', answer('b'), 60_000, now());
    expect(cache.get('alice', 'a')).toBeDefined(); // a is now the most recently used
    cache.remember('alice', 'c', answer('c'), 60_000, now());
    expect(cache.get('alice', 'b')).toBeUndefined();
    expect(cache.get('alice', 'a')?.response.body).toBe('a');
    expect(cache.get('alice', 'c')?.response.body).toBe('c');
  });

  it('bounds the bytes it holds, and never holds one answer larger than the bound', () => {
    const cache = new ReplayCache(100, 100, now);
    cache.remember('alice', 'big', answer('x'.repeat(200)), 60_000, now());
    expect(cache.get('alice', 'big')).toBeUndefined();
    cache.remember('alice', 'a', answer('x'.repeat(45)), 60_000, now());
    cache.remember('alice', 'b', answer('x'.repeat(45)), 60_000, now());
    expect(cache.size).toBe(1); // each entry is 45 + fingerprint + key + client bytes: two do not fit
    expect(cache.get('alice', 'b')).toBeDefined();
  });

  it('remembering a key again replaces its entry instead of counting it twice', () => {
    const cache = new ReplayCache(2, 1_000_000, now);
    cache.remember('alice', 'a', answer('a'), 60_000, now());
    cache.remember('alice', 'a', answer('a'), 120_000, now());
    cache.remember('alice', 'b', answer('b'), 60_000, now());
    expect(cache.size).toBe(2);
    clock += 100_000;
    expect(cache.get('alice', 'a')).toBeDefined();
  });

  it('holds nothing when sized 0 (IDEMPOTENCY_REPLAY_CACHE_ENTRIES=0)', () => {
    const cache = new ReplayCache(0, 1_000_000, now);
    cache.remember('alice', 'a', answer('a'), 60_000, now());
    expect(cache.get('alice', 'a')).toBeUndefined();
  });
});
