/** Where the loop reports a round that threw (a relay's round should catch its own errors; this is the backstop). */
export interface RelayLoopLogger {
  warn(message: string): void;
}

export interface RelayLoopOptions {
  /** One round of the relay: claim what is due, send it, record the outcomes. Resolves with the ms until the next round. */
  round(): Promise<number>;
  /** The wait after a round that threw. */
  retryAfterErrorMs: number;
  logger: RelayLoopLogger;
}

/**
 * The lease/wake/backoff loop both outbox relays run (the sandbox's webhook relay and the order events relay):
 * rounds never overlap (the next is scheduled when one ends); `wake()` (a NOTIFY, a reconnect) runs a round now, or
 * right after the running one; `stop()` cancels the timer and waits for the running round, so that round's outcomes
 * are recorded before the database pool closes. What a round claims and how it backs off stays with each relay.
 */
export class RelayLoop {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private stopped = false;
  private started = false;
  /** A wake arrived during a round: go again as soon as it ends. */
  private wokenDuringRound = false;
  /** True while the relay's LISTEN connection is up (it then sleeps until a notification or the next due row). */
  listening = false;

  constructor(private readonly options: RelayLoopOptions) {}

  /** True after start() until stop(). */
  get active(): boolean {
    return this.started && !this.stopped;
  }

  get stopping(): boolean {
    return this.stopped;
  }

  start(): void {
    this.started = true;
    this.schedule(0);
  }

  wake(): void {
    if (this.stopped || !this.started) return;
    if (this.running) {
      this.wokenDuringRound = true;
      return;
    }
    clearTimeout(this.timer);
    this.schedule(0);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.running;
  }

  private schedule(delayMs: number): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.running = this.runRound().then((next) => {
        this.running = undefined;
        const woken = this.wokenDuringRound;
        this.wokenDuringRound = false;
        this.schedule(woken ? 0 : next);
      });
    }, delayMs);
  }

  private async runRound(): Promise<number> {
    try {
      return await this.options.round();
    } catch (err) {
      this.options.logger.warn(`relay round failed: ${err instanceof Error ? err.message : String(err)}`);
      return this.options.retryAfterErrorMs;
    }
  }
}

/**
 * The wait before the next attempt after `failures` failed attempts (1 = the first one failed): base · 2^(failures-1),
 * capped, minus up to a quarter at random so that the retries of many rows (or many instances) do not arrive in lockstep.
 */
export function retryDelayMs(
  failures: number,
  { baseMs, capMs }: { baseMs: number; capMs: number },
  random: () => number = Math.random,
): number {
  const exponent = Math.max(0, failures - 1);
  const base = Math.min(capMs, baseMs * 2 ** Math.min(exponent, 30));
  return Math.round(base * (1 - 0.25 * random()));
}
