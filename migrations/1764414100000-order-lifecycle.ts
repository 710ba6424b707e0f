import type { MigrationInterface, QueryRunner } from 'typeorm';

/** The history of status transitions. Every constraint says which duplicate or bad state it rules out. */
export class OrderLifecycle1764414100000 implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`
      CREATE TABLE "order_events" (
        "id" uuid NOT NULL DEFAULT gen_random_uuid(),
        "order_id" uuid NOT NULL,
        "from_status" text NOT NULL,
        "to_status" text NOT NULL,
        "created_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        CONSTRAINT "pk_order_events" PRIMARY KEY ("id"),
        -- Only the state machine's statuses, as in ck_orders_status.
        CONSTRAINT "ck_order_events_from_status" CHECK ("from_status" IN ('created', 'paid', 'cancelled', 'shipped', 'delivered', 'refunded')),
        CONSTRAINT "ck_order_events_to_status" CHECK ("to_status" IN ('created', 'paid', 'cancelled', 'shipped', 'delivered', 'refunded')),
        -- Only the state machine's edges (order-state-machine.ts): no history row for a move the
        -- service would refuse, and none for a repeated transition (from = to is not an edge).
        CONSTRAINT "ck_order_events_transition" CHECK (("from_status", "to_status") IN (('created', 'paid'), ('created', 'cancelled'), ('paid', 'shipped'), ('paid', 'cancelled'), ('shipped', 'delivered'), ('cancelled', 'refunded'))),
        -- No history without its order; deleting an order takes its history with it.
        CONSTRAINT "fk_order_events_order" FOREIGN KEY ("order_id") REFERENCES "orders"("id") ON DELETE CASCADE ON UPDATE NO ACTION
      )`);
    // An order's history in order; also serves the foreign key, so deleting an order scans no more than its events.
    await queryRunner.query(`CREATE INDEX "ix_order_events_order_created" ON "order_events" ("order_id", "created_at")`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP TABLE "order_events"`);
  }
}
