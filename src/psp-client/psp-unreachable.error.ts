/**
 * A lookup could not get an answer (no 200 within its attempts, or its breaker is open). Thrown,
 * never returned as an empty list: "the provider has no such charge" and "we could not ask" lead
 * to opposite decisions (fail the payment vs. keep it pending).
 */
export class PspUnreachableError extends Error {
  override readonly name = 'PspUnreachableError';

  constructor(
    readonly operation: string,
    readonly reason: string,
  ) {
    super(`${operation}: the payment provider could not be asked (${reason})`);
  }
}
