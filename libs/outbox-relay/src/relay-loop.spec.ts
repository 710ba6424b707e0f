import { RelayLoop, retryDelayMs } from './relay-loop.js';

/** A round the test ends by hand: how the loop behaves while one runs is what matters. */
function controlledRounds() {
  const started: { finish(nextMs: number): void }[] = [];
  let running = 0;
  let overlapped = false;
  const round = () =>
    new Promise<number>((resolve) => {
      running++;
      if (running > 1) overlapped = true;
      started.push({
        finish: (nextMs) => {
          running--;
          resolve(nextMs);
        },
      });
    });
  return { round, started, overlapped: () => overlapped };
}

async function until(done: () => boolean, deadlineMs = 2_000): Promise<void> {
  const deadline = Date.now() + deadlineMs;
  while (!done()) {
    if (Date.now() > deadline) throw new Error(`not within ${deadlineMs} ms`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

describe('RelayLoop (the outbox relays’ shared round loop)', () => {
  const logger = { warn: () => undefined };

  it('runs the first round at once, never two at a time, and a wake during a round runs the next right after it', async () => {
    const rounds = controlledRounds();
    const loop = new RelayLoop({ round: rounds.round, retryAfterErrorMs: 60_000, logger });
    loop.start();
    await until(() => rounds.started.length === 1);
    // Woken three times mid-round: one more round, after this one, not three and not in parallel.
    loop.wake();
    loop.wake();
    loop.wake();
    rounds.started[0].finish(60_000);
    await until(() => rounds.started.length === 2);
    rounds.started[1].finish(60_000);
    await new Promise((r) => setTimeout(r, 50));
    expect(rounds.started).toHaveLength(2);
    expect(rounds.overlapped()).toBe(false);
    // Idle (next round a minute away): a wake runs one now.
    loop.wake();
    await until(() => rounds.started.length === 3);
    const stopped = loop.stop();
    rounds.started[2].finish(0);
    await stopped;
  });

  it('stop() waits for the running round and no round starts after it, however it is woken', async () => {
    const rounds = controlledRounds();
    const loop = new RelayLoop({ round: rounds.round, retryAfterErrorMs: 60_000, logger });
    loop.start();
    await until(() => rounds.started.length === 1);
    let stopped = false;
    const stopping = loop.stop().then(() => (stopped = true));
    loop.wake();
    await new Promise((r) => setTimeout(r, 20));
    expect(stopped).toBe(false);
    rounds.started[0].finish(0);
    await stopping;
    loop.wake();
    await new Promise((r) => setTimeout(r, 50));
    expect(rounds.started).toHaveLength(1);
    expect(loop.active).toBe(false);
  });

  it('a round that throws is logged and retried after retryAfterErrorMs', async () => {
    const warnings: string[] = [];
    let calls = 0;
    const loop = new RelayLoop({
      round: () => (++calls === 1 ? Promise.reject(new Error('database away')) : Promise.resolve(60_000)),
      retryAfterErrorMs: 10,
      logger: { warn: (message) => warnings.push(message) },
    });
    loop.start();
    await until(() => calls === 2);
    await loop.stop();
    expect(warnings).toEqual(['relay round failed: database away']);
  });
});

describe('retryDelayMs', () => {
  it('doubles from the base, stops at the cap, and jitter takes at most a quarter', () => {
    const plan = { baseMs: 500, capMs: 30_000 };
    expect([1, 2, 3, 7, 1_000].map((n) => retryDelayMs(n, plan, () => 0))).toEqual([500, 1_000, 2_000, 30_000, 30_000]);
    expect(retryDelayMs(100, plan, () => 1)).toBe(22_500);
  });
});
