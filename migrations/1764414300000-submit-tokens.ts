import type { MigrationInterface, QueryRunner } from 'typeorm';

/** Single-use submit tokens (src/submit-tokens): the other way to make POST /orders safe to repeat. */
export class SubmitTokens1764414300000 implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`
      CREATE TABLE "submit_tokens" (
        "token" text NOT NULL,
        "client_id" text NOT NULL,
        "created_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        "expires_at" TIMESTAMP WITH TIME ZONE NOT NULL,
        "consumed_at" TIMESTAMP WITH TIME ZONE,
        "order_id" uuid,
        -- One row per token, so one consumption per token: the consuming UPDATE locks this row,
        -- concurrent submits of the token queue behind it, and only the first finds it unconsumed.
        CONSTRAINT "pk_submit_tokens" PRIMARY KEY ("token"),
        -- Only a consumed token names an order: no token that points at an order and could still
        -- create a second one.
        CONSTRAINT "ck_submit_tokens_order_only_when_consumed" CHECK ("order_id" IS NULL OR "consumed_at" IS NOT NULL),
        -- The order a reused token is answered with. SET NULL, not CASCADE: if the order goes, the
        -- token stays consumed and still cannot create another.
        CONSTRAINT "fk_submit_tokens_order" FOREIGN KEY ("order_id") REFERENCES "orders"("id") ON DELETE SET NULL ON UPDATE NO ACTION
      )`);
    // The reaper deletes long-expired tokens oldest first, in small batches.
    await queryRunner.query(`CREATE INDEX "ix_submit_tokens_expires_at" ON "submit_tokens" ("expires_at")`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP TABLE "submit_tokens"`);
  }
}
