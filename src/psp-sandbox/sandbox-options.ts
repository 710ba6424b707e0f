export const SANDBOX_OPTIONS = Symbol('SANDBOX_OPTIONS');

export interface SandboxOptions {
  /** The service's database; the sandbox keeps to its `psp` schema, through its own pool. */
  databaseUrl: string;
  /** The client's per-attempt timeout (PSP_TIMEOUT_MS): the slow tokens' delays are multiples of it. */
  timeoutMs: number;
}
