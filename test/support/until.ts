/**
 * Polls `done` every `intervalMs` until it answers true, or rejects after `deadlineMs` naming what it waited for:
 * the broker suite's one way to wait for something another process does (never a sleep standing in for it).
 */
export async function until(what: string, deadlineMs: number, done: () => Promise<boolean> | boolean, intervalMs = 20): Promise<void> {
  const deadline = Date.now() + deadlineMs;
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`not within ${deadlineMs} ms: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}
