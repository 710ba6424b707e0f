// The sandbox provider's own tables (schema psp). Their class names and timestamps are those they had when they were
// the service's migrations: TypeORM records a migration by name, so a database migrated then sees them as applied.
// Later ones take a timestamp after every migration of either list, so the one timestamp order stays the order they were written in.
import { PspSandbox1764414500000 } from './1764414500000-psp-sandbox.js';
import { PspWebhookOutbox1764414800000 } from './1764414800000-psp-webhook-outbox.js';
import { PspChargesListing1764415700000 } from './1764415700000-psp-charges-listing.js';
import { PspChargeDeployment1764416000000 } from './1764416000000-psp-charge-deployment.js';

export const pspSandboxMigrations = [
  PspSandbox1764414500000,
  PspWebhookOutbox1764414800000,
  PspChargesListing1764415700000,
  PspChargeDeployment1764416000000,
];
