import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * The order events' outbox (docs/patterns/transactional-outbox.md): createOrder and transitionOrder write an event
 * row in the SAME statement as the change it reports, so an event exists exactly when its change committed. The
 * relay (src/events/order-events-relay.ts) publishes the rows to RabbitMQ at least once and marks them sent.
 *
 * Safe while old processes serve: a new table and its trigger, nothing old reads or writes them. Changes an old
 * process makes during the rollout have no event (it does not know the table); the docs say so.
 * Raw SQL, no entity: only the service's own SQL touches it (`migration:check` ignores a table without an entity).
 */
export class OrderEventsOutbox1764415500000 implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`
      CREATE TABLE "order_events_outbox" (
        "event_id" uuid NOT NULL,
        "type" text NOT NULL,
        "order_id" uuid NOT NULL,
        "client_id" text NOT NULL,
        "order_version" integer NOT NULL,
        "payload" jsonb NOT NULL,
        "created_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        "available_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        "attempts" integer NOT NULL DEFAULT 0,
        "last_error" text,
        "sent_at" TIMESTAMP WITH TIME ZONE,
        -- The event id is the message id every publish of the event carries (consumers dedupe on it): one row per event.
        CONSTRAINT "pk_order_events_outbox" PRIMARY KEY ("event_id"),
        -- One event per version of an order: a change recorded twice (a statement repeated, a second writer)
        -- fails instead of publishing two different events for one change.
        CONSTRAINT "uq_order_events_outbox_order_version" UNIQUE ("order_id", "order_version"),
        -- Only the four types of the message contract; the routing key is the type.
        CONSTRAINT "ck_order_events_outbox_type" CHECK ("type" IN ('order.created', 'order.paid', 'order.cancelled', 'order.refunded')),
        -- The message body is a JSON object, never a bare value a consumer cannot read.
        CONSTRAINT "ck_order_events_outbox_payload" CHECK (jsonb_typeof("payload") = 'object'),
        CONSTRAINT "ck_order_events_outbox_version" CHECK ("order_version" >= 1),
        CONSTRAINT "ck_order_events_outbox_attempts" CHECK ("attempts" >= 0),
        -- A sent row was claimed at least once (the claim that published it).
        CONSTRAINT "ck_order_events_outbox_sent" CHECK ("sent_at" IS NULL OR "attempts" >= 1)
      )`);
    // What the relay scans every round: unsent rows in due order. Partial, so sent history costs the claim nothing.
    await queryRunner.query(`
      CREATE INDEX "ix_order_events_outbox_due" ON "order_events_outbox" ("available_at") WHERE "sent_at" IS NULL`);
    // No NOTIFY trigger: a transaction that NOTIFYs holds a server-wide lock through its COMMIT, so every create and
    // transition would commit one at a time, and even a trigger that only checks whether a relay listens cost a create
    // 12 % of its PostgreSQL CPU. The relays poll the partial index above instead (order-events-relay.ts).
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP TABLE "order_events_outbox"`);
  }
}
