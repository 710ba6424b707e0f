import type { MigrationInterface, QueryRunner } from 'typeorm';

/** The Idempotency-Key dedupe table (src/idempotency). */
export class IdempotencyKeys1764414200000 implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`
      CREATE TABLE "idempotency_keys" (
        "id" uuid NOT NULL DEFAULT gen_random_uuid(),
        "client_id" text NOT NULL,
        "key" text NOT NULL,
        "fingerprint" text NOT NULL,
        "request_method" text NOT NULL,
        "request_path" text NOT NULL,
        "state" text NOT NULL DEFAULT 'in_progress',
        "recovery_point" text NOT NULL DEFAULT 'started',
        "locked_until" TIMESTAMP WITH TIME ZONE,
        "response_status" integer,
        "response_headers" jsonb,
        "response_body" text,
        "created_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        "completed_at" TIMESTAMP WITH TIME ZONE,
        "expires_at" TIMESTAMP WITH TIME ZONE NOT NULL,
        CONSTRAINT "pk_idempotency_keys" PRIMARY KEY ("id"),
        -- The claim. Two requests with one key (from one client) cannot both insert: the second
        -- waits for the first's transaction, then finds its row and replays it. Scoped by client,
        -- so two clients that pick the same key never meet.
        CONSTRAINT "uq_idempotency_keys_client_key" UNIQUE ("client_id", "key"),
        CONSTRAINT "ck_idempotency_keys_state" CHECK ("state" IN ('in_progress', 'completed')),
        CONSTRAINT "ck_idempotency_keys_key_length" CHECK (char_length("key") BETWEEN 1 AND 255),
        -- A completed key always has a response to replay: no "done but nothing to send" rows.
        CONSTRAINT "ck_idempotency_keys_completed_has_response" CHECK ("state" <> 'completed' OR ("response_status" IS NOT NULL AND "response_body" IS NOT NULL AND "completed_at" IS NOT NULL))
      )`);
    // The reaper deletes expired keys oldest first, in small batches.
    await queryRunner.query(`CREATE INDEX "ix_idempotency_keys_expires_at" ON "idempotency_keys" ("expires_at")`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP TABLE "idempotency_keys"`);
  }
}
