/**
 * A refusal to start whose message says everything a user needs (what is wrong, what to set): printed alone,
 * on one line, without a stack trace, and the process exits 1.
 */
export class StartupError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'StartupError';
  }
}
