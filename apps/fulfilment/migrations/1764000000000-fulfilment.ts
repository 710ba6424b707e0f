import type { MigrationInterface, QueryRunner } from 'typeorm';
import { createProcessedMessagesTable } from '@idempotent-orders/idempotency/messages';

/**
 * The fulfilment consumer's own schema: new objects only, nothing of the order service's touched, so it is safe
 * to apply while any old process (of either app) serves.
 */
export class Fulfilment1764000000000 implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`CREATE SCHEMA IF NOT EXISTS fulfilment`);
    await createProcessedMessagesTable(queryRunner, 'fulfilment.processed_messages');
    await queryRunner.query(`
      CREATE TABLE fulfilment.shipments (
        -- The business key, checked before any mark could be: one shipment per order, whatever the message ids
        -- (a republished event, a replayed dead letter, a mark already reaped).
        order_id uuid NOT NULL CONSTRAINT pk_shipments PRIMARY KEY,
        client_id text NOT NULL,
        -- 'pending': to be shipped (the order is paid); 'cancelled': not to be shipped (refunded or cancelled,
        -- possibly before its payment's event arrived).
        status text NOT NULL CONSTRAINT ck_shipments_status CHECK (status IN ('pending', 'cancelled')),
        total_minor bigint NOT NULL CONSTRAINT ck_shipments_total CHECK (total_minor >= 0),
        currency char(3) NOT NULL,
        -- The order's version of the last event applied: an older event arriving later changes nothing.
        order_version integer NOT NULL CONSTRAINT ck_shipments_version CHECK (order_version >= 1),
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now()
      )`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP SCHEMA fulfilment CASCADE`);
  }
}
