import type { MigrationInterface, QueryRunner } from 'typeorm';

/** Orders and their lines. Every constraint says which duplicate or bad state it rules out. */
export class Orders1764414000000 implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`
      CREATE TABLE "orders" (
        "id" uuid NOT NULL DEFAULT gen_random_uuid(),
        "client_id" text NOT NULL,
        "order_number" text NOT NULL,
        "status" text NOT NULL DEFAULT 'created',
        "currency" text NOT NULL,
        "total_minor" bigint NOT NULL,
        "shipping_address" jsonb,
        "note" text,
        "version" integer NOT NULL DEFAULT '1',
        "created_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        "updated_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        CONSTRAINT "pk_orders" PRIMARY KEY ("id"),
        -- The natural key. A create repeated under any Idempotency-Key, or under none, with the
        -- same order number cannot make a second order: the INSERT hits this and becomes a read.
        CONSTRAINT "uq_orders_client_order_number" UNIQUE ("client_id", "order_number"),
        -- Only the state machine's statuses; a typo in a transition fails loudly.
        CONSTRAINT "ck_orders_status" CHECK ("status" IN ('created', 'paid', 'cancelled', 'shipped', 'delivered', 'refunded')),
        -- ISO 4217 codes are three capital letters (the API checks the code is a real one).
        CONSTRAINT "ck_orders_currency" CHECK ("currency" ~ '^[A-Z]{3}$'),
        -- Money is integer minor units and never negative.
        CONSTRAINT "ck_orders_total_minor" CHECK ("total_minor" >= 0),
        -- The optimistic-lock counter starts at 1 and only grows.
        CONSTRAINT "ck_orders_version" CHECK ("version" >= 1)
      )`);
    // Keyset pagination (newest first) per client, with and without a status filter.
    await queryRunner.query(`CREATE INDEX "ix_orders_client_created" ON "orders" ("client_id", "created_at", "id")`);
    await queryRunner.query(`CREATE INDEX "ix_orders_client_status_created" ON "orders" ("client_id", "status", "created_at", "id")`);
    await queryRunner.query(`
      CREATE TABLE "order_items" (
        "order_id" uuid NOT NULL,
        "line_no" integer NOT NULL,
        "sku" text NOT NULL,
        "quantity" integer NOT NULL,
        "unit_price_minor" bigint NOT NULL,
        -- A line is written once per order: a repeated insert of the same line fails instead of doubling it.
        CONSTRAINT "pk_order_items" PRIMARY KEY ("order_id", "line_no"),
        CONSTRAINT "ck_order_items_quantity" CHECK ("quantity" BETWEEN 1 AND 10000),
        CONSTRAINT "ck_order_items_unit_price_minor" CHECK ("unit_price_minor" >= 0),
        -- No line without its order; deleting an order takes its lines with it.
        CONSTRAINT "fk_order_items_order" FOREIGN KEY ("order_id") REFERENCES "orders"("id") ON DELETE CASCADE ON UPDATE NO ACTION
      )`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP TABLE "order_items"`);
    await queryRunner.query(`DROP TABLE "orders"`);
  }
}
