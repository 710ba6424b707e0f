import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * The webhook consumer (src/webhooks): the events it has processed, the refunds of charges the
 * provider made after we had given a payment up, and the indexes the pending-age gauges read.
 * Every constraint names the duplicate or the impossible state it rules out.
 */
export class Webhooks1764414700000 implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`
      CREATE TABLE "processed_webhook_events" (
        "webhook_id" text NOT NULL,
        "type" text,
        "outcome" text NOT NULL,
        "detail" text NOT NULL,
        "payment_id" uuid,
        "refund_id" uuid,
        "received_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        -- At-least-once delivery sends one event many times, sequentially or at once. The row is
        -- inserted in the transaction of the event's effect: a redelivery's INSERT conflicts (waiting
        -- for the first delivery's transaction if it is still open), so the effect happens once.
        CONSTRAINT "pk_processed_webhook_events" PRIMARY KEY ("webhook_id"),
        CONSTRAINT "ck_processed_webhook_events_outcome" CHECK ("outcome" IN ('applied', 'no_effect'))
      )`);
    // The reaper deletes rows past their retention, oldest first.
    await queryRunner.query(`CREATE INDEX "ix_processed_webhook_events_received_at" ON "processed_webhook_events" ("received_at")`);

    await queryRunner.query(`
      CREATE TABLE "late_charge_refunds" (
        "id" uuid NOT NULL DEFAULT gen_random_uuid(),
        "charge_id" text NOT NULL,
        "payment_id" uuid NOT NULL,
        "amount_minor" bigint NOT NULL,
        "outbound_key" text NOT NULL,
        "status" text NOT NULL DEFAULT 'pending',
        "provider_refund_id" text,
        "failure_code" text,
        "attempts" integer NOT NULL DEFAULT 0,
        "next_attempt_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        "created_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        "updated_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        CONSTRAINT "pk_late_charge_refunds" PRIMARY KEY ("id"),
        CONSTRAINT "ck_late_charge_refunds_status" CHECK ("status" IN ('pending', 'succeeded', 'failed')),
        CONSTRAINT "ck_late_charge_refunds_amount_minor" CHECK ("amount_minor" > 0),
        -- One refund per late charge: two events about it (a redelivery under a new webhook id, a
        -- charge.succeeded sent twice) can never refund it twice.
        CONSTRAINT "uq_late_charge_refunds_charge" UNIQUE ("charge_id"),
        -- The provider's dedupe key (late_<chargeId>): every retry of the refund call is the same refund there.
        CONSTRAINT "uq_late_charge_refunds_outbound_key" UNIQUE ("outbound_key"),
        CONSTRAINT "fk_late_charge_refunds_payment" FOREIGN KEY ("payment_id") REFERENCES "payments"("id") ON DELETE RESTRICT ON UPDATE NO ACTION
      )`);
    // The retry job looks for pending refunds that are due; few rows, so the index stays tiny.
    await queryRunner.query(
      `CREATE INDEX "ix_late_charge_refunds_pending" ON "late_charge_refunds" ("next_attempt_at") WHERE "status" = 'pending'`,
    );

    // payments_oldest_pending_seconds reads min(created_at) of pending rows at every scrape: these
    // partial indexes hold only the pending rows, so that is one index probe, never a table scan.
    await queryRunner.query(`CREATE INDEX "ix_payments_pending_created" ON "payments" ("created_at") WHERE "status" = 'pending'`);
    await queryRunner.query(`CREATE INDEX "ix_refunds_pending_created" ON "refunds" ("created_at") WHERE "status" = 'pending'`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP INDEX "ix_refunds_pending_created"`);
    await queryRunner.query(`DROP INDEX "ix_payments_pending_created"`);
    await queryRunner.query(`DROP TABLE "late_charge_refunds"`);
    await queryRunner.query(`DROP TABLE "processed_webhook_events"`);
  }
}
