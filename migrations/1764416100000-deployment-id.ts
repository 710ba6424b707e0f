import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * This deployment's id: a random UUID made once, when its database is first migrated, and written into every charge's
 * `metadata.deploymentId`. The repairs of lost payments (src/payments/lost-payments.ts) refund only charges that carry
 * it, so a deployment sharing the provider account with others (or with another service) never takes their charges
 * for its own lost payments. It lives in the database, not in a setting: every process of one deployment reads the
 * same id, a failover keeps it (it replicated long before), and two deployments on two databases cannot share it by
 * a forgotten setting.
 *
 * Safe while old processes serve: a new table they never read.
 */
export class DeploymentId1764416100000 implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`
      CREATE TABLE "deployment" (
        "one_row" boolean NOT NULL DEFAULT true,
        "id" uuid NOT NULL DEFAULT gen_random_uuid(),
        "created_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
        -- One id per database: a second row would let two processes of one deployment tag charges differently, and
        -- each would then take the other's charges for someone else's.
        CONSTRAINT "pk_deployment" PRIMARY KEY ("one_row"),
        CONSTRAINT "ck_deployment_one_row" CHECK ("one_row")
      )`);
    await queryRunner.query(`INSERT INTO "deployment" DEFAULT VALUES`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP TABLE "deployment"`);
  }
}
