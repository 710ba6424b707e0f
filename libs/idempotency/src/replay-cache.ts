import type { StoredResponse } from './idempotency-keys.service.js';
import type { SealedAnswer, StoredResponseCipher } from './stored-response-cipher.js';

/** What a replay needs of a completed key: the request it is bound to and the answer to send again. */
export interface CompletedKey {
  fingerprint: string;
  response: StoredResponse;
}

/**
 * Both clocks at one moment, in ms: the monotonic one (immune to clock steps) and the wall one (which keeps counting while the host is
 * suspended).
 */
export interface ClockReading {
  monotonic: number;
  wall: number;
}

export const readClocks = (): ClockReading => ({ monotonic: performance.now(), wall: Date.now() });

interface Entry {
  fingerprint: string;
  /**
   * The answer, sealed when encryption is on: memory (a heap dump, a core file) then holds no plain copy beyond the
   * requests in flight, and opening one costs microseconds against the round trip it saves.
   */
  response: StoredResponse | SealedAnswer;
  /** The entry is used only while both clocks are before these: the key may expire and be taken over after. */
  until: ClockReading;
  bytes: number;
}

/**
 * Dropped this long before the key's expiry as the database measured it. The remaining time is read
 * from PostgreSQL and counted down from before the statement that read it was sent, on both of this
 * process's clocks (the first to run out ends the entry), so wall clocks that disagree between hosts
 * cannot matter; only a difference in their rates could, and a second covers a day of drift many times over.
 */
export const REPLAY_CACHE_EXPIRY_MARGIN_MS = 1_000;

/**
 * Completed keys' answers, in this process, so that a retry storm is answered without a round trip.
 *
 * Sound because a completed key never changes while it lives: its response is written once, in the
 * transaction that made the effect, and no statement touches a completed row again before it expires
 * (take-over and the reaper both require `expires_at <= now()`). So an entry only has to stop being
 * used before the key's expiry, and the database, not this cache, still decides everything else:
 * a miss, an unfinished key, or an expired one goes through the claim as before. (What it does assume:
 * that committed rows stay committed. A failover to a replica that lost recent commits, or a restore,
 * would make the database forget keys this cache still answers, until they expire: turn it off,
 * IDEMPOTENCY_REPLAY_CACHE_ENTRIES=0, where that can happen and matters.)
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
    /** The clocks (a test passes its own). */
    private readonly clocks: () => ClockReading = readClocks,
    /** Seals what is kept when the layer's responseEncryption is on. */
    private readonly cipher?: StoredResponseCipher,
  ) {}

  get(clientId: string, key: string): CompletedKey | undefined {
    const slot = keySlot(clientId, key);
    const entry = this.entries.get(slot);
    if (!entry) return undefined;
    this.entries.delete(slot);
    const now = this.clocks();
    if (now.monotonic >= entry.until.monotonic || now.wall >= entry.until.wall) {
      this.bytes -= entry.bytes;
      return undefined;
    }
    this.entries.set(slot, entry); // most recently used last
    const { response } = entry;
    return { fingerprint: entry.fingerprint, response: 'sealed' in response ? this.cipher!.open(response, slot) : response };
  }

  /**
   * `expiresInMs`: the key's remaining life as PostgreSQL measured it; `sentAt`: the clocks read before the
   * statement that measured it was sent (so time spent on the way back only makes the entry end earlier).
   */
  remember(clientId: string, key: string, completed: CompletedKey, expiresInMs: number, sentAt: ClockReading): void {
    if (this.maxEntries === 0) return;
    const usableFor = expiresInMs - REPLAY_CACHE_EXPIRY_MARGIN_MS;
    if (usableFor <= 0) return;
    const slot = keySlot(clientId, key);
    const response = this.cipher?.enabled ? this.cipher.seal(completed.response, slot) : completed.response;
    const bytes = ('sealed' in response ? response.sealed.length : response.body.length) + completed.fingerprint.length + slot.length;
    if (bytes > this.maxBytes) return;
    const previous = this.entries.get(slot);
    if (previous) {
      this.entries.delete(slot);
      this.bytes -= previous.bytes;
    }
    const until = { monotonic: sentAt.monotonic + usableFor, wall: sentAt.wall + usableFor };
    this.entries.set(slot, { fingerprint: completed.fingerprint, response, until, bytes });
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

/** Keys are scoped to their client: one client's key never answers another's request (a client id holds no newline). */
export const keySlot = (clientId: string, key: string) => `${clientId}\n${key}`;
