import type { MigrationInterface, QueryRunner } from 'typeorm';

const INDEXES = [
  ['payments', 'ix_payments_unreached'],
  ['refunds', 'ix_refunds_unreached'],
] as const;

/**
 * The sweep of rows failed as never reached (docs/patterns/reconciliation.md) also looks, every run, for rows an
 * older build failed so without putting them on its list (ProviderAttempts.adoptUnreached): these partial indexes
 * hold only such rows, so that look is an index probe of a handful of entries, never a scan of payments or refunds.
 * No constraint: they prevent no duplicate, they only keep a query cheap.
 *
 * Built CONCURRENTLY, so both tables keep taking writes while they are indexed; that cannot run in a transaction,
 * so each step is safe to run again if the migration is interrupted. An older build still serving reads nothing new.
 */
export class UnreachedSweep1764415100000 implements MigrationInterface {
  readonly transaction = false;

  async up(queryRunner: QueryRunner): Promise<void> {
    // Outside a transaction these would reach the pooled connection's session: reset in the finally.
    await queryRunner.query(`SET lock_timeout = 0`);
    await queryRunner.query(`SET statement_timeout = 0`);
    try {
      for (const [table, index] of INDEXES) {
        // A build interrupted earlier leaves an invalid index behind: start again from nothing.
        await queryRunner.query(`DROP INDEX CONCURRENTLY IF EXISTS "${index}"`);
        await queryRunner.query(
          `CREATE INDEX CONCURRENTLY "${index}" ON "${table}" ("updated_at") WHERE "status" = 'failed' AND "failure_code" = 'provider_unreachable'`,
        );
      }
    } finally {
      await queryRunner.query(`RESET statement_timeout`);
      await queryRunner.query(`RESET lock_timeout`);
    }
  }

  // TypeORM reverts inside a transaction whatever `transaction` says, so no CONCURRENTLY here.
  async down(queryRunner: QueryRunner): Promise<void> {
    for (const [, index] of INDEXES) await queryRunner.query(`DROP INDEX IF EXISTS "${index}"`);
  }
}
