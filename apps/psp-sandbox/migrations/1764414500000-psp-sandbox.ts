import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * The sandbox payment provider (apps/psp-sandbox): its own schema, so nothing of the service's
 * can join or lock its tables by accident, and dropping it removes the whole stand-in.
 * Raw SQL through its own pool, no TypeORM entities (so `migration:check` ignores it).
 */
export class PspSandbox1764414500000 implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`CREATE SCHEMA "psp"`);
    // The provider's Idempotency-Key record: the answer it gave, replayed to every retry of the key.
    // A row exists only together with the charge or refund it answered (same transaction).
    await queryRunner.query(`
      CREATE TABLE "psp"."idempotency_keys" (
        "key" text NOT NULL,
        "fingerprint" text NOT NULL,
        "response_status" integer NOT NULL,
        "response_body" text NOT NULL,
        "created_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        -- The claim: two requests with one key cannot both insert. The second waits for the first's
        -- transaction (INSERT … ON CONFLICT), then replays its answer: one key, one charge or refund, one answer.
        CONSTRAINT "pk_psp_idempotency_keys" PRIMARY KEY ("key"),
        CONSTRAINT "ck_psp_idempotency_keys_key_length" CHECK (char_length("key") BETWEEN 1 AND 255),
        -- Only recorded outcomes are stored: a created charge/refund (201) or a recorded decline (402).
        CONSTRAINT "ck_psp_idempotency_keys_status" CHECK ("response_status" IN (201, 402))
      )`);
    await queryRunner.query(`
      CREATE TABLE "psp"."charges" (
        "id" text NOT NULL,
        "idempotency_key" text NOT NULL,
        "status" text NOT NULL,
        "amount_minor" bigint NOT NULL,
        "refunded_minor" bigint NOT NULL DEFAULT 0,
        "currency" text NOT NULL,
        "source" text NOT NULL,
        "failure_code" text,
        "order_id" uuid NOT NULL,
        "payment_id" uuid NOT NULL,
        "created_at" TIMESTAMP WITH TIME ZONE NOT NULL,
        CONSTRAINT "pk_psp_charges" PRIMARY KEY ("id"),
        -- One Idempotency-Key can never produce two charges, whatever the retries and races.
        CONSTRAINT "uq_psp_charges_idempotency_key" UNIQUE ("idempotency_key"),
        -- ... and a charge always has the key record that replays its answer.
        CONSTRAINT "fk_psp_charges_idempotency_key" FOREIGN KEY ("idempotency_key") REFERENCES "psp"."idempotency_keys" ("key"),
        CONSTRAINT "ck_psp_charges_status" CHECK ("status" IN ('succeeded', 'failed')),
        -- A failed charge says why; a succeeded one has no failure code.
        CONSTRAINT "ck_psp_charges_failure_code" CHECK (("status" = 'failed') = ("failure_code" IS NOT NULL)),
        -- Amounts stay exact as JSON numbers (2^53 - 1).
        CONSTRAINT "ck_psp_charges_amount" CHECK ("amount_minor" BETWEEN 1 AND 9007199254740991),
        -- Refunds can never exceed the charge: the backstop behind the conditional UPDATE that reserves them.
        CONSTRAINT "ck_psp_charges_refunded" CHECK ("refunded_minor" BETWEEN 0 AND "amount_minor"),
        -- A failed charge took no money, so nothing of it can be refunded.
        CONSTRAINT "ck_psp_charges_refunded_only_succeeded" CHECK ("status" = 'succeeded' OR "refunded_minor" = 0),
        CONSTRAINT "ck_psp_charges_currency" CHECK ("currency" ~ '^[A-Z]{3}$')
      )`);
    // Lookups for reconciling (GET /psp/charges?orderId=|paymentId=).
    await queryRunner.query(`CREATE INDEX "ix_psp_charges_order_id" ON "psp"."charges" ("order_id")`);
    await queryRunner.query(`CREATE INDEX "ix_psp_charges_payment_id" ON "psp"."charges" ("payment_id")`);
    await queryRunner.query(`
      CREATE TABLE "psp"."refunds" (
        "id" text NOT NULL,
        "idempotency_key" text NOT NULL,
        "charge_id" text NOT NULL,
        "status" text NOT NULL,
        "amount_minor" bigint NOT NULL,
        "failure_code" text,
        "refund_id" uuid NOT NULL,
        "payment_id" uuid NOT NULL,
        "created_at" TIMESTAMP WITH TIME ZONE NOT NULL,
        CONSTRAINT "pk_psp_refunds" PRIMARY KEY ("id"),
        -- One Idempotency-Key can never produce two refunds (nor a refund and a charge: the key table's primary key).
        CONSTRAINT "uq_psp_refunds_idempotency_key" UNIQUE ("idempotency_key"),
        CONSTRAINT "fk_psp_refunds_idempotency_key" FOREIGN KEY ("idempotency_key") REFERENCES "psp"."idempotency_keys" ("key"),
        CONSTRAINT "fk_psp_refunds_charge" FOREIGN KEY ("charge_id") REFERENCES "psp"."charges" ("id"),
        CONSTRAINT "ck_psp_refunds_status" CHECK ("status" IN ('succeeded', 'failed')),
        CONSTRAINT "ck_psp_refunds_failure_code" CHECK (("status" = 'failed') = ("failure_code" IS NOT NULL)),
        CONSTRAINT "ck_psp_refunds_amount" CHECK ("amount_minor" BETWEEN 1 AND 9007199254740991)
      )`);
    await queryRunner.query(`CREATE INDEX "ix_psp_refunds_charge_id" ON "psp"."refunds" ("charge_id")`);
    await queryRunner.query(`CREATE INDEX "ix_psp_refunds_refund_id" ON "psp"."refunds" ("refund_id")`);
    // Attempts per Idempotency-Key for the tokens that fail the first attempts (tok_flaky).
    await queryRunner.query(`
      CREATE TABLE "psp"."fault_attempts" (
        "idempotency_key" text NOT NULL,
        "attempts" integer NOT NULL,
        -- One counter per key, bumped by an upsert: concurrent attempts each get their own number,
        -- so exactly the first two fail however many arrive at once.
        CONSTRAINT "pk_psp_fault_attempts" PRIMARY KEY ("idempotency_key"),
        CONSTRAINT "ck_psp_fault_attempts_attempts" CHECK ("attempts" >= 1)
      )`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP SCHEMA "psp" CASCADE`);
  }
}
