// Migrations are listed, not globbed: the list is type-checked and works the same from src and dist.
// The sandbox provider's tables are its own (apps/psp-sandbox/migrations), applied with these where it is mounted.
import { Orders1764414000000 } from './1764414000000-orders.js';
import { OrderLifecycle1764414100000 } from './1764414100000-order-lifecycle.js';
import { IdempotencyKeys1764414200000 } from './1764414200000-idempotency-keys.js';
import { SubmitTokens1764414300000 } from './1764414300000-submit-tokens.js';
import { OrderCreationDigest1764414400000 } from './1764414400000-order-creation-digest.js';
import { Payments1764414600000 } from './1764414600000-payments.js';
import { Webhooks1764414700000 } from './1764414700000-webhooks.js';
import { KeyRowHotUpdates1764414900000 } from './1764414900000-key-row-hot-updates.js';
import { LateLandings1764415000000 } from './1764415000000-late-landings.js';
import { UnreachedSweep1764415100000 } from './1764415100000-unreached-sweep.js';
import { OrderEventsOutbox1764415500000 } from './1764415500000-order-events-outbox.js';
import { StoredAnswerEncryption1764415600000 } from './1764415600000-stored-answer-encryption.js';
import { UnrecordedProviderMoney1764415800000 } from './1764415800000-unrecorded-provider-money.js';
import { DeploymentId1764416100000 } from './1764416100000-deployment-id.js';

export const migrations = [
  Orders1764414000000,
  OrderLifecycle1764414100000,
  IdempotencyKeys1764414200000,
  SubmitTokens1764414300000,
  OrderCreationDigest1764414400000,
  Payments1764414600000,
  Webhooks1764414700000,
  KeyRowHotUpdates1764414900000,
  LateLandings1764415000000,
  UnreachedSweep1764415100000,
  OrderEventsOutbox1764415500000,
  StoredAnswerEncryption1764415600000,
  UnrecordedProviderMoney1764415800000,
  DeploymentId1764416100000,
];
