import type { AttemptResult } from './attempt-result.js';
import { ClientBreakers, type PspBreaker } from './psp-breaker.js';

/** One call whose outcome stayed unknown: with a threshold of 1, the breaker opens. */
async function fail(breaker: PspBreaker): Promise<void> {
  await breaker.policy.execute((): AttemptResult => ({ kind: 'skipped', verdict: 'unknown' }));
}

describe('ClientBreakers', () => {
  it('gives each client a breaker of its own, the same one on every call', async () => {
    const breakers = new ClientBreakers('charges', 60_000, 1);
    await fail(breakers.of('alice'));
    expect(breakers.of('alice').check().open).toBe(true);
    expect(breakers.of('bob').check().open).toBe(false);
    expect(breakers.of('alice').owner).toBe('alice');
  });

  it('keeps at most its limit of clients, forgetting the one used least recently', async () => {
    const breakers = new ClientBreakers('charges', 60_000, 1, 2);
    await fail(breakers.of('alice'));
    breakers.of('bob');
    // Alice used again: Bob is now the oldest, and the third client pushes him out, not her.
    expect(breakers.of('alice').check().open).toBe(true);
    breakers.of('carol');
    expect(breakers.size).toBe(2);
    expect(breakers.of('alice').check().open).toBe(true);

    // Two newer clients push Alice out: she comes back to a closed breaker.
    breakers.of('dave');
    breakers.of('erin');
    expect(breakers.size).toBe(2);
    expect(breakers.of('alice').check().open).toBe(false);
  });
});
