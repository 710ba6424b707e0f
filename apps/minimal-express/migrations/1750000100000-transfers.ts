import type { MigrationInterface, QueryRunner } from 'typeorm';

export class Transfers1750000100000 implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
    // No unique business key: the Idempotency-Key is what keeps a retried POST from making a second transfer.
    await queryRunner.query(`
      CREATE TABLE "transfers" (
        "id" uuid NOT NULL DEFAULT gen_random_uuid(),
        "client_id" text NOT NULL,
        "to_account" text NOT NULL,
        "amount_minor" integer NOT NULL,
        "created_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        CONSTRAINT "pk_transfers" PRIMARY KEY ("id"),
        CONSTRAINT "ck_transfers_amount_positive" CHECK ("amount_minor" > 0)
      )`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP TABLE "transfers"`);
  }
}
