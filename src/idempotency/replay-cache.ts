import type { StoredResponse } from './idempotency-keys.service.js';

/** What a replay needs of a completed key: the request it is bound to and the answer to send again. */
export interface CompletedKey {
  fingerprint: string;
  response: StoredResponse;
}

interface Entry extends CompletedKey {
  /** The clock's time after which the entry is not used: the key may expire and be taken over. */
  usableUntil: number;
  bytes: number;
}

/**
 * Dropped this long before the key's expiry as the database measured it. The remaining time is read
 * from PostgreSQL and counted down on this process's monotonic clock, so wall clocks that disagree
 * between hosts cannot matter; only the rate of the two clocks could, and a second covers a day of
 * drift many times over.
 */
export const REPLAY_CACHE_EXPIRY_MARGIN_MS = 1_000;

/**
 * Completed keys' answers, in this process, so that a retry storm is answered without a round trip.
 *
 * Sound because a completed key never changes while it lives: its response is written once, in the
 * transaction that made the effect, and no statement touches a completed row again before it expires
 * (take-over and the reaper both require `expires_at <= now()`). So an entry only has to stop being
 * used before the key's expiry, and the database, not this cache, still decides everything else:
 * a miss, an unfinished key, or an expired one goes through the read and the claim as before.
 *
 * Filled on a key's first replay, not when it is created: most keys are never retried, and memory
 * then holds only keys that actually are. Bounded by entries and by body bytes; least recently used
 * first out.
 */
export class ReplayCache {
  private readonly entries = new Map<string, Entry>();
  private bytes = 0;

  constructor(
    private readonly maxEntries: number,
    private readonly maxBytes: number,
    /** A monotonic clock in ms (a test passes its own). */
    private readonly now: () => number = () => performance.now(),
  ) {}

  get(clientId: string, key: string): CompletedKey | undefined {
    const slot = slotOf(clientId, key);
    const entry = this.entries.get(slot);
    if (!entry) return undefined;
    this.entries.delete(slot);
    if (this.now() >= entry.usableUntil) {
      this.bytes -= entry.bytes;
      return undefined;
    }
    this.entries.set(slot, entry); // most recently used last
    return { fingerprint: entry.fingerprint, response: entry.response };
  }

  /** `expiresInMs`: the key's remaining life as PostgreSQL measured it when the row was read. */
  remember(clientId: string, key: string, completed: CompletedKey, expiresInMs: number): void {
    if (this.maxEntries === 0) return;
    const usableFor = expiresInMs - REPLAY_CACHE_EXPIRY_MARGIN_MS;
    const bytes = completed.response.body.length + completed.fingerprint.length + key.length + clientId.length;
    if (usableFor <= 0 || bytes > this.maxBytes) return;
    const slot = slotOf(clientId, key);
    const previous = this.entries.get(slot);
    if (previous) {
      this.entries.delete(slot);
      this.bytes -= previous.bytes;
    }
    this.entries.set(slot, { ...completed, usableUntil: this.now() + usableFor, bytes });
    this.bytes += bytes;
    for (const [oldest, entry] of this.entries) {
      if (this.entries.size <= this.maxEntries && this.bytes <= this.maxBytes) break;
      this.entries.delete(oldest);
      this.bytes -= entry.bytes;
    }
  }

  get size(): number {
    return this.entries.size;
  }
}

/** Keys are scoped to their client: one client's key never answers another's request. */
const slotOf = (clientId: string, key: string) => `${clientId}\n${key}`;
