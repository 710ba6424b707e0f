/** The metadata @Idempotent() puts on a route, read by the interceptor. */
export const IDEMPOTENT = Symbol('idempotent');

export interface IdempotentOptions {
  /** Missing key → 400 (the default). With `false`, a request without a key runs as it would without this decorator. */
  required?: boolean;
  /** Request headers that are part of what the key is bound to, like the body (`If-Match` on a PATCH). */
  boundHeaders?: readonly string[];
}
