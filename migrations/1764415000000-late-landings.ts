import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * What a settler needs so that a provider request which lands late can never cost the customer twice
 * (docs/patterns/reconciliation.md, "Late landings"):
 * - `last_attempt_by`: no attempt for this payment (refund) was sent after this instant. Whoever holds the
 *   key writes it before calling out; until it plus PSP_MAX_LATENCY_MS has passed, the attempt may still
 *   reach the provider, so nobody may decide that the provider never saw it. NULL on rows written by a
 *   version that did not know the column (a rolling deploy): read as created_at + 1 hour, the longest lease.
 * - `recheck_at`: when the sweep next asks the provider about a row we failed as provider_unreachable, in
 *   case money landed after every bound; NULL once it stops asking.
 *
 * Safe while old processes serve: nullable columns without a default (no table rewrite, a brief lock
 * taken with lock_timeout so it never queues traffic behind it), indexes built CONCURRENTLY. Outside a
 * transaction, so each step is written to be run again if the migration is interrupted.
 */
export class LateLandings1764415000000 implements MigrationInterface {
  readonly transaction = false;

  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`SET lock_timeout = '5s'`);
    try {
      for (const table of ['payments', 'refunds']) {
        await queryRunner.query(`ALTER TABLE "${table}" ADD COLUMN IF NOT EXISTS "last_attempt_by" TIMESTAMP WITH TIME ZONE`);
        await queryRunner.query(`ALTER TABLE "${table}" ADD COLUMN IF NOT EXISTS "recheck_at" TIMESTAMP WITH TIME ZONE`);
      }
      await queryRunner.query(`SET lock_timeout = 0`);
      await queryRunner.query(`SET statement_timeout = 0`);
      for (const table of ['payments', 'refunds']) {
        // The sweep's scan: only rows it still rechecks are in it, so it stays tiny. An interrupted build leaves an invalid index: start again.
        await queryRunner.query(`DROP INDEX CONCURRENTLY IF EXISTS "ix_${table}_recheck" `);
        await queryRunner.query(`CREATE INDEX CONCURRENTLY "ix_${table}_recheck" ON "${table}" ("recheck_at") WHERE "recheck_at" IS NOT NULL`);
      }
    } finally {
      await queryRunner.query(`RESET statement_timeout`);
      await queryRunner.query(`RESET lock_timeout`);
    }
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    for (const table of ['refunds', 'payments']) {
      await queryRunner.query(`DROP INDEX IF EXISTS "ix_${table}_recheck"`);
      await queryRunner.query(`ALTER TABLE "${table}" DROP COLUMN IF EXISTS "recheck_at"`);
      await queryRunner.query(`ALTER TABLE "${table}" DROP COLUMN IF EXISTS "last_attempt_by"`);
    }
  }
}
