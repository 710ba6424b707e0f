import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * Payments and refunds (src/payments), and the lease that fences the phases of a payment's
 * Idempotency-Key. Every constraint names the duplicate or the impossible state it rules out.
 */
export class Payments1764414600000 implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
    // The holder of a phased key (a payment request, its retry, the reconciler) writes only while
    // lease_token is still its own: a holder whose lease ran out and was taken over cannot settle
    // or complete anything afterwards (its fenced UPDATE matches no row).
    await queryRunner.query(`ALTER TABLE "idempotency_keys" ADD "lease_token" uuid`);
    // The reconciler looks for unfinished phased keys whose lease has run out.
    await queryRunner.query(
      `CREATE INDEX "ix_idempotency_keys_unfinished_lease" ON "idempotency_keys" ("locked_until") WHERE "state" = 'in_progress'`,
    );

    await queryRunner.query(`
      CREATE TABLE "payments" (
        "id" uuid NOT NULL DEFAULT gen_random_uuid(),
        "client_id" text NOT NULL,
        "order_id" uuid NOT NULL,
        "idempotency_key_id" uuid,
        "status" text NOT NULL DEFAULT 'pending',
        "amount_minor" bigint NOT NULL,
        "currency" text NOT NULL,
        "source" text NOT NULL,
        "provider" text NOT NULL DEFAULT 'sandbox',
        "provider_transaction_id" text,
        "outbound_key" text NOT NULL,
        "refunded_minor" bigint NOT NULL DEFAULT 0,
        "failure_code" text,
        "created_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        "updated_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        CONSTRAINT "pk_payments" PRIMARY KEY ("id"),
        CONSTRAINT "ck_payments_status" CHECK ("status" IN ('pending', 'succeeded', 'failed')),
        CONSTRAINT "ck_payments_amount_minor" CHECK ("amount_minor" > 0),
        CONSTRAINT "ck_payments_currency" CHECK ("currency" ~ '^[A-Z]{3}$'),
        -- A succeeded payment always names the provider's charge, so it can be looked up and refunded.
        CONSTRAINT "ck_payments_succeeded_has_charge" CHECK ("status" <> 'succeeded' OR "provider_transaction_id" IS NOT NULL),
        -- Refunds (reserved and settled) never exceed what was paid, whatever number of refunds race.
        CONSTRAINT "ck_payments_refunded_minor" CHECK ("refunded_minor" BETWEEN 0 AND "amount_minor"),
        -- One provider charge is one payment: a late webhook or a second settler cannot attach a charge twice.
        CONSTRAINT "uq_payments_provider_transaction" UNIQUE ("provider", "provider_transaction_id"),
        -- The key the provider dedupes on, derived from the payment id and stored before the first
        -- attempt: two payments can never share one, so two payments can never be one charge.
        CONSTRAINT "uq_payments_outbound_key" UNIQUE ("outbound_key"),
        CONSTRAINT "fk_payments_order" FOREIGN KEY ("order_id") REFERENCES "orders"("id") ON DELETE RESTRICT ON UPDATE NO ACTION,
        -- A key outlives its payment's settlement only for IDEMPOTENCY_TTL_SECONDS; the payment stays.
        CONSTRAINT "fk_payments_idempotency_key" FOREIGN KEY ("idempotency_key_id") REFERENCES "idempotency_keys"("id") ON DELETE SET NULL ON UPDATE NO ACTION
      )`);
    // At most one payment per order that is pending or succeeded: two keys paying one order at
    // once cannot both charge it (the second insert is a 23505 → 409 payment-in-progress).
    // A failed payment does not count, so a declined order can be paid again with a new key.
    await queryRunner.query(
      `CREATE UNIQUE INDEX "ux_payments_one_active_per_order" ON "payments" ("order_id") WHERE "status" IN ('pending', 'succeeded')`,
    );
    await queryRunner.query(`CREATE INDEX "ix_payments_order_created" ON "payments" ("order_id", "created_at")`);
    await queryRunner.query(`CREATE INDEX "ix_payments_idempotency_key" ON "payments" ("idempotency_key_id")`);

    await queryRunner.query(`
      CREATE TABLE "refunds" (
        "id" uuid NOT NULL DEFAULT gen_random_uuid(),
        "client_id" text NOT NULL,
        "payment_id" uuid NOT NULL,
        "idempotency_key_id" uuid,
        "status" text NOT NULL DEFAULT 'pending',
        "amount_minor" bigint NOT NULL,
        "provider" text NOT NULL DEFAULT 'sandbox',
        "provider_refund_id" text,
        "outbound_key" text NOT NULL,
        "failure_code" text,
        "created_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        "updated_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        CONSTRAINT "pk_refunds" PRIMARY KEY ("id"),
        CONSTRAINT "ck_refunds_status" CHECK ("status" IN ('pending', 'succeeded', 'failed')),
        CONSTRAINT "ck_refunds_amount_minor" CHECK ("amount_minor" > 0),
        CONSTRAINT "ck_refunds_succeeded_has_provider_refund" CHECK ("status" <> 'succeeded' OR "provider_refund_id" IS NOT NULL),
        -- One provider refund is one refund of ours.
        CONSTRAINT "uq_refunds_provider_refund" UNIQUE ("provider", "provider_refund_id"),
        -- As for payments: the provider's dedupe key, never shared by two refunds.
        CONSTRAINT "uq_refunds_outbound_key" UNIQUE ("outbound_key"),
        CONSTRAINT "fk_refunds_payment" FOREIGN KEY ("payment_id") REFERENCES "payments"("id") ON DELETE RESTRICT ON UPDATE NO ACTION,
        CONSTRAINT "fk_refunds_idempotency_key" FOREIGN KEY ("idempotency_key_id") REFERENCES "idempotency_keys"("id") ON DELETE SET NULL ON UPDATE NO ACTION
      )`);
    await queryRunner.query(`CREATE INDEX "ix_refunds_payment_created" ON "refunds" ("payment_id", "created_at")`);
    await queryRunner.query(`CREATE INDEX "ix_refunds_idempotency_key" ON "refunds" ("idempotency_key_id")`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP TABLE "refunds"`);
    await queryRunner.query(`DROP TABLE "payments"`);
    await queryRunner.query(`DROP INDEX "ix_idempotency_keys_unfinished_lease"`);
    await queryRunner.query(`ALTER TABLE "idempotency_keys" DROP COLUMN "lease_token"`);
  }
}
