import { Injectable, type OnModuleDestroy } from '@nestjs/common';

interface PendingDelay {
  timer: NodeJS.Timeout;
  finish(elapsed: boolean): void;
}

/**
 * The injected delays of the slow test tokens. Every timer is tracked, so a closing app (or Jest)
 * is never kept alive by an answer nobody will read: the module's destroy hook ends them all, and
 * a client that hangs up ends its own at once.
 */
@Injectable()
export class AnswerDelays implements OnModuleDestroy {
  private readonly pending = new Set<PendingDelay>();
  private closing = false;

  /** True once `ms` have passed; false as soon as `clientGone` aborts or the app closes. Holds nothing but a timer. */
  wait(ms: number, clientGone: AbortSignal): Promise<boolean> {
    if (this.closing || clientGone.aborted) return Promise.resolve(false);
    if (ms <= 0) return Promise.resolve(true);
    return new Promise<boolean>((resolve) => {
      const delay: PendingDelay = {
        timer: setTimeout(() => delay.finish(true), ms),
        finish: (elapsed) => {
          clearTimeout(delay.timer);
          clientGone.removeEventListener('abort', onAbort);
          this.pending.delete(delay);
          resolve(elapsed);
        },
      };
      const onAbort = () => delay.finish(false);
      clientGone.addEventListener('abort', onAbort, { once: true });
      this.pending.add(delay);
    });
  }

  /** How many answers are being held back right now (for tests). */
  get size(): number {
    return this.pending.size;
  }

  onModuleDestroy(): void {
    this.closing = true;
    for (const delay of [...this.pending]) delay.finish(false);
  }
}
