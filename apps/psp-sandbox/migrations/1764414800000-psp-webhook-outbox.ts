import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * The sandbox provider's webhook outbox (apps/psp-sandbox/src/webhook-relay.ts): every recorded charge
 * and refund writes its event here in the SAME transaction, so an event exists exactly when its
 * charge or refund does — a crash can lose neither the one nor the other. The relay delivers
 * the rows at least once. Raw SQL on the sandbox's own pool, no entity (`migration:check` ignores it).
 */
export class PspWebhookOutbox1764414800000 implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`
      CREATE TABLE "psp"."webhook_outbox" (
        "id" text NOT NULL,
        "copy" smallint NOT NULL DEFAULT 1,
        "type" text NOT NULL,
        "payload" jsonb NOT NULL,
        "attempts" integer NOT NULL DEFAULT 0,
        "next_attempt_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        "delivered_at" TIMESTAMP WITH TIME ZONE,
        "last_error" text,
        "created_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        -- "id" is the event id, sent as webhook-id on every attempt of every copy (the consumer dedupes on it).
        -- One row per copy (PSP_WEBHOOK_DUPLICATES writes copy 2 as well): an event can never be queued
        -- twice as the same copy, and the relay marks exactly the copy it delivered.
        CONSTRAINT "pk_psp_webhook_outbox" PRIMARY KEY ("id", "copy"),
        -- At most the two copies the duplicates mode asks for.
        CONSTRAINT "ck_psp_webhook_outbox_copy" CHECK ("copy" IN (1, 2)),
        -- Only the four event types a consumer knows how to read.
        CONSTRAINT "ck_psp_webhook_outbox_type" CHECK ("type" IN ('charge.succeeded', 'charge.failed', 'refund.succeeded', 'refund.failed')),
        -- The body's "data" is always a JSON object, never a bare value a consumer cannot read.
        CONSTRAINT "ck_psp_webhook_outbox_payload" CHECK (jsonb_typeof("payload") = 'object'),
        CONSTRAINT "ck_psp_webhook_outbox_attempts" CHECK ("attempts" >= 0),
        -- A delivered row was attempted at least once (the attempt that got the 2xx).
        CONSTRAINT "ck_psp_webhook_outbox_delivered" CHECK ("delivered_at" IS NULL OR "attempts" >= 1)
      )`);
    // What the relay scans every round: the undelivered rows in due order. Partial, so delivered
    // history (the bulk of the table, over time) costs the poll nothing.
    await queryRunner.query(`
      CREATE INDEX "ix_psp_webhook_outbox_due" ON "psp"."webhook_outbox" ("next_attempt_at") WHERE "delivered_at" IS NULL`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP TABLE "psp"."webhook_outbox"`);
  }
}
