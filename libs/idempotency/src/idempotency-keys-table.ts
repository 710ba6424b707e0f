import type { QueryRunner } from 'typeorm';

/**
 * The layer's table as one migration, for an app that adds it to its list:
 *
 *   export class IdempotencyKeys1750000000000 implements MigrationInterface {
 *     up = createIdempotencyKeysTable;
 *     down = dropIdempotencyKeysTable;
 *   }
 *
 * The same table the service reaches through its own migrations (a test compares the two).
 */
export async function createIdempotencyKeysTable(queryRunner: QueryRunner): Promise<void> {
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
      "lease_token" uuid,
      "response_key_id" text,
      "response_sealed" bytea,
      CONSTRAINT "pk_idempotency_keys" PRIMARY KEY ("id"),
      -- The claim. Two requests with one key (from one caller) cannot both insert: the second
      -- waits for the first's transaction, then finds its row and replays it. Scoped by caller,
      -- so two callers that pick the same key never meet.
      CONSTRAINT "uq_idempotency_keys_client_key" UNIQUE ("client_id", "key"),
      CONSTRAINT "ck_idempotency_keys_state" CHECK ("state" IN ('in_progress', 'completed')),
      CONSTRAINT "ck_idempotency_keys_key_length" CHECK (char_length("key") BETWEEN 1 AND 255),
      -- A completed key always has an answer to replay: no "done but nothing to send" rows.
      CONSTRAINT "ck_idempotency_keys_completed_has_response" CHECK ("state" <> 'completed' OR ("response_status" IS NOT NULL AND "response_body" IS NOT NULL AND "completed_at" IS NOT NULL)),
      -- A sealed answer (responseEncryption) belongs to its row's one completed answer: no stale seal beside a newer one.
      CONSTRAINT "ck_idempotency_keys_sealed_answer" CHECK ("response_sealed" IS NULL OR ("state" = 'completed' AND "response_key_id" IS NOT NULL))
    ) WITH (fillfactor = 70)`);
  // The reaper deletes expired keys oldest first, in small batches.
  await queryRunner.query(`CREATE INDEX "ix_idempotency_keys_expires_at" ON "idempotency_keys" ("expires_at")`);
  // Phased keys whose lease has run out, for a reconciler. On locked_until alone (not state), so recording
  // an answer changes no indexed column and rewrites the row in place (a HOT update; fillfactor leaves it room).
  await queryRunner.query(
    `CREATE INDEX "ix_idempotency_keys_unfinished_lease" ON "idempotency_keys" ("locked_until") WHERE "locked_until" IS NOT NULL`,
  );
}

export async function dropIdempotencyKeysTable(queryRunner: QueryRunner): Promise<void> {
  await queryRunner.query(`DROP TABLE "idempotency_keys"`);
}
