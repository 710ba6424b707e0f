import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * What a settler needs so that a provider request which lands late can never cost the customer twice
 * (docs/patterns/reconciliation.md, "Late landings"), one row per payment or refund sent to the provider:
 * - `last_attempt_by`: no attempt was sent after this instant. Whoever holds the key writes it before calling
 *   out; until it plus PSP_MAX_LATENCY_MS has passed, the attempt may still reach the provider, so nobody may
 *   decide that the provider never saw it. No row (written by a version before this one): read as the
 *   payment's created_at + 1 hour, the longest lease.
 * - `recheck_at`: when the sweep next asks the provider about a row we failed as provider_unreachable, in
 *   case money landed after every bound; NULL once it stops asking.
 *
 * A table of its own rather than columns on payments and refunds: an older version still serving reads
 * those through `SELECT *` in named prepared statements, and a new column would fail every one of them
 * (0A000) until its connections were replaced. A new table changes nothing they read.
 */
export class LateLandings1764415000000 implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`
      CREATE TABLE "provider_attempts" (
        "subject_id" uuid NOT NULL,
        "subject" text NOT NULL,
        "last_attempt_by" TIMESTAMP WITH TIME ZONE NOT NULL,
        "unreached_at" TIMESTAMP WITH TIME ZONE,
        "recheck_at" TIMESTAMP WITH TIME ZONE,
        -- One bound per payment or refund (their ids are UUIDs, never shared): two holders' bounds are merged
        -- into this row with greatest(), never kept side by side where a reader could take the smaller.
        CONSTRAINT "pk_provider_attempts" PRIMARY KEY ("subject_id"),
        CONSTRAINT "ck_provider_attempts_subject" CHECK ("subject" IN ('payment', 'refund')),
        -- The sweep asks again only about rows failed as never reached, from the moment they were.
        CONSTRAINT "ck_provider_attempts_recheck" CHECK ("recheck_at" IS NULL OR "unreached_at" IS NOT NULL)
      )`);
    // The sweep's scan: only rows it still rechecks are in it, so it stays tiny.
    await queryRunner.query(
      `CREATE INDEX "ix_provider_attempts_recheck" ON "provider_attempts" ("recheck_at") WHERE "recheck_at" IS NOT NULL`,
    );
    // Rows the previous version failed as never reached within the last day may have had money land on them
    // since (that is the fault this migration closes): the sweep asks about each of them once more, soon.
    for (const [table, subject] of [
      ['payments', 'payment'],
      ['refunds', 'refund'],
    ]) {
      await queryRunner.query(
        `INSERT INTO "provider_attempts" ("subject_id", "subject", "last_attempt_by", "unreached_at", "recheck_at")
         SELECT "id", '${subject}', "updated_at", "updated_at", now() FROM "${table}"
          WHERE "status" = 'failed' AND "failure_code" = 'provider_unreachable' AND "updated_at" > now() - interval '24 hours'
         ON CONFLICT DO NOTHING`,
      );
    }
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP TABLE "provider_attempts"`);
  }
}
