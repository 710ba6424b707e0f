/**
 * The sandbox payment provider's public entry (`#psp-sandbox`): what a host app mounts, the migrations it must then
 * apply, and what tests drive. Code outside apps/psp-sandbox imports only this file (lint forbids deep imports).
 */
export { pspSandboxMigrations } from '../migrations/index.js';
export { AnswerDelays } from './answer-delays.js';
export { PROVIDER_KEY_SCHEME, PROVIDER_KEY_SECURITY_SCHEME, PSP_SANDBOX_TAG } from './psp-sandbox.controller.js';
export { PspSandboxModule } from './psp-sandbox.module.js';
export { selfUrl } from './self-url.js';
export { simulatesFault } from './test-tokens.js';
export type { SandboxOptions, SandboxWebhookDelivery, SandboxWebhookOptions } from './sandbox-options.js';
export { WebhookRelay } from './webhook-relay.js';
