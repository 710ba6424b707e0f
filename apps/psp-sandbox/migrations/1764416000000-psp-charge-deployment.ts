import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * A charge's `metadata.deploymentId`: which deployment of a client made it, when several share one provider account
 * (docs/contract.md#sandbox-provider). The service's repairs of lost payments refund only its own charges by it.
 *
 * A nullable column with no default: added without rewriting the table, under a lock held for an instant, and every
 * row an older sandbox writes (without it) is still valid. lock_timeout: a lock not granted within 5 s fails the
 * migration, to be run again, rather than queueing every charge behind it for longer.
 */
export class PspChargeDeployment1764416000000 implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`SET LOCAL lock_timeout = '5s'`);
    await queryRunner.query(`ALTER TABLE "psp"."charges" ADD COLUMN IF NOT EXISTS "deployment_id" text`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`ALTER TABLE "psp"."charges" DROP COLUMN IF EXISTS "deployment_id"`);
  }
}
