import type { MigrationInterface } from 'typeorm';
import { createIdempotencyKeysTable, dropIdempotencyKeysTable } from '@idempotent-orders/idempotency';

/** The Idempotency-Key layer's table, as the layer defines it. */
export class IdempotencyKeys1750000000000 implements MigrationInterface {
  up = createIdempotencyKeysTable;
  down = dropIdempotencyKeysTable;
}
