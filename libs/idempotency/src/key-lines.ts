import { Injectable } from '@nestjs/common';

/**
 * The last request in line for each (client, key) in THIS process: settles once that request has
 * finished, and every one ahead of it. A duplicate that arrives here waits in memory for the one
 * before it, holding no pooled connection, instead of blocking on the key's row lock: a storm of
 * retries cannot drain the pool, not even when the first request fails and the key is free again
 * (then the next in line claims it, and only it). Only a queue in front of the claim, which still
 * decides (and is what makes duplicates on other instances wait).
 */
@Injectable()
export class KeyLines {
  private readonly lines = new Map<string, Promise<void>>();

  /** Takes a place in `slot`'s line: `ahead` settles when every request before this one has finished; call `leave` when this one has. */
  join(slot: string): { ahead: Promise<void> | undefined; leave: () => void } {
    const ahead = this.lines.get(slot);
    let done!: () => void;
    const finished = new Promise<void>((resolve) => (done = resolve));
    // Whoever comes next waits for this request AND everyone ahead, even if this one gives up waiting.
    const line = ahead ? ahead.then(() => finished) : finished;
    this.lines.set(slot, line);
    return {
      ahead,
      leave: () => {
        done();
        if (this.lines.get(slot) === line) this.lines.delete(slot);
      },
    };
  }
}
