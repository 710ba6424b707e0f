export const SANDBOX_OPTIONS = Symbol('SANDBOX_OPTIONS');

/** Where the relay sends events; the host's config parses PSP_WEBHOOK_URL into this (the sandbox reads no environment). */
export type SandboxWebhookDelivery = { to: 'self' } | { to: 'url'; url: string } | { to: 'none' };

export interface SandboxWebhookOptions {
  /** PSP_WEBHOOK_URL: `self` = the service's own /webhooks/psp, `url`, or `none` (events stay in the outbox). */
  delivery: SandboxWebhookDelivery;
  /** PSP_WEBHOOK_DUPLICATES: every event is queued as two copies with one webhook-id. */
  duplicates: boolean;
  /** PSP_WEBHOOK_SECRET (`whsec_…`): the Standard Webhooks signing key. */
  secret: string;
}

export interface SandboxOptions {
  /** The service's database; the sandbox keeps to its `psp` schema, through its own pool. */
  databaseUrl: string;
  /** PSP_API_KEY: the secret key every /psp request must carry (`Authorization: Bearer <key>`), as a merchant's. */
  apiKey: string;
  /** The client's per-attempt timeout (PSP_TIMEOUT_MS): the slow tokens' delays are multiples of it. */
  timeoutMs: number;
  webhooks: SandboxWebhookOptions;
}
