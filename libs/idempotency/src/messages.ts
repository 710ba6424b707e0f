// The layer's entry for message handlers, `@idempotent-orders/idempotency/messages` (package.json "exports"): an
// @EventPattern / @MessagePattern handler that runs once per message id. `IdempotencyModule` and `Database` come from
// the HTTP entry; the transport is the app's (@nestjs/microservices, an optional peer: the layer imports none of it).

/** Marks a message handler: claim the message id in the handler's transaction, commit it with the effect, ack after COMMIT. */
export { IdempotentMessage, type IdempotentMessageOptions, IdempotentMessageInterceptor } from './idempotent-message.js';
/** The defaults a consumer app may override (its name, attempts before dead-lettering, …). */
export { IDEMPOTENT_MESSAGE_DEFAULTS, type IdempotentMessageDefaults, MAX_BATCH_SIZE, type MessageBatching } from './idempotent-message.js';
/** The processed-messages table for your migration, the reaper's delete, and the claim's SQL (to show it beside a naive one). */
export {
  claimMessagesStatement,
  claimMessageStatement,
  createProcessedMessagesTable,
  reapProcessedMessages,
} from './idempotent-message.js';
