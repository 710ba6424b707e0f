import type { MigrationInterface, QueryRunner } from 'typeorm';

const INDEX = 'ix_psp_charges_created_at_id';

/**
 * The listing of recent charges (GET /psp/charges?createdAfter=…&startingAfter=…): it reads psp.charges in
 * (created_at, id) order from a point, a page at a time. This index is that order, so each page is a short index range
 * however many charges came before it; without it every page would sort the table. No constraint: it only keeps a read cheap.
 *
 * Built CONCURRENTLY, as the house builds every index on a table that takes writes, so charges keep being recorded
 * while it builds. The sandbox's tables are small and a build would be over in moments anyway; the rule is kept so that
 * no migration here is an exception to copy. That cannot run in a transaction, so each step is safe to run again if the
 * migration is interrupted. An older build still serving reads nothing new.
 */
export class PspChargesListing1764415700000 implements MigrationInterface {
  readonly transaction = false;

  async up(queryRunner: QueryRunner): Promise<void> {
    // Outside a transaction these would reach the pooled connection's session: reset in the finally.
    await queryRunner.query(`SET lock_timeout = 0`);
    await queryRunner.query(`SET statement_timeout = 0`);
    try {
      // A build interrupted earlier leaves an invalid index behind: start again from nothing.
      await queryRunner.query(`DROP INDEX CONCURRENTLY IF EXISTS "psp"."${INDEX}"`);
      await queryRunner.query(`CREATE INDEX CONCURRENTLY "${INDEX}" ON "psp"."charges" ("created_at", "id")`);
    } finally {
      await queryRunner.query(`RESET statement_timeout`);
      await queryRunner.query(`RESET lock_timeout`);
    }
  }

  // TypeORM reverts inside a transaction whatever `transaction` says, so no CONCURRENTLY here.
  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP INDEX IF EXISTS "psp"."${INDEX}"`);
  }
}
