import type { MigrationInterface, QueryRunner } from 'typeorm';

const ONE_PAYMENT = 'ck_late_charge_refunds_one_payment';
const OUTBOX_TYPE = 'ck_order_events_outbox_type';
const OUTBOX_TYPES = `'order.created', 'order.paid', 'order.cancelled', 'order.refunded'`;

/**
 * Money at the provider that our books do not know (docs/running-it.md, "Beyond one node"): a database failover with
 * asynchronous replication can lose a payment whose charge went out. Its charge is refunded like a late charge, by a
 * late_charge_refunds row that names the lost payment's id instead of referencing a payment row; the order that
 * vanished with it is announced as `order.voided`, so fulfilment cancels what it shipped for it; and the sweep that
 * lists the provider's charges keeps its place in provider_charge_sweep.
 *
 * Safe while old processes serve. Not one transaction: each statement commits on its own, so a check is added NOT
 * VALID under a lock held for an instant, and validated afterwards, which scans without holding off writes (in one
 * transaction the scan would run under the first statement's exclusive lock, stopping every create and transition).
 * A lock not granted within lock_timeout fails the statement rather than queueing every writer behind it; each step
 * is safe to run again. The new column is nullable with no default (nothing rewritten); every row an old process
 * writes satisfies both checks (it always sets payment_id, and writes only the four event types it knows). An old
 * process's retry job joins payments, so it leaves a lost payment's refund to a new process.
 */
export class UnrecordedProviderMoney1764415800000 implements MigrationInterface {
  readonly transaction = false;

  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`SET lock_timeout = '5s'`);
    await queryRunner.query(`SET statement_timeout = 0`);
    try {
      await queryRunner.query(`ALTER TABLE "late_charge_refunds" ALTER COLUMN "payment_id" DROP NOT NULL`);
      await queryRunner.query(`ALTER TABLE "late_charge_refunds" ADD COLUMN IF NOT EXISTS "lost_payment_id" uuid`);
      // Exactly one of the two: a refund is for a payment we hold, or for one the provider charged and we lost — never
      // neither (a refund nobody can trace) nor both.
      await queryRunner.query(
        `ALTER TABLE "late_charge_refunds" DROP CONSTRAINT IF EXISTS "${ONE_PAYMENT}",
           ADD CONSTRAINT "${ONE_PAYMENT}" CHECK (num_nonnulls("payment_id", "lost_payment_id") = 1) NOT VALID`,
      );
      await queryRunner.query(`ALTER TABLE "late_charge_refunds" VALIDATE CONSTRAINT "${ONE_PAYMENT}"`);
      // The contract's fifth type; still only the contract's types, so the routing key is always one a consumer knows.
      await queryRunner.query(
        `ALTER TABLE "order_events_outbox" DROP CONSTRAINT IF EXISTS "${OUTBOX_TYPE}",
           ADD CONSTRAINT "${OUTBOX_TYPE}" CHECK ("type" IN (${OUTBOX_TYPES}, 'order.voided')) NOT VALID`,
      );
      await queryRunner.query(`ALTER TABLE "order_events_outbox" VALIDATE CONSTRAINT "${OUTBOX_TYPE}"`);
      // Where the sweep of the provider's charges goes on from: one row, advanced after each complete run. A failover
      // that loses a payment loses every advance committed after it too, so the next run lists that payment's charge.
      await queryRunner.query(`
        CREATE TABLE IF NOT EXISTS "provider_charge_sweep" (
          "id" smallint NOT NULL DEFAULT 1,
          "listed_from" TIMESTAMP WITH TIME ZONE NOT NULL,
          -- One cursor: a second row would let two sweeps disagree about where to go on from.
          CONSTRAINT "pk_provider_charge_sweep" PRIMARY KEY ("id"),
          CONSTRAINT "ck_provider_charge_sweep_one_row" CHECK ("id" = 1)
        )`);
    } finally {
      await queryRunner.query(`RESET statement_timeout`);
      await queryRunner.query(`RESET lock_timeout`);
    }
  }

  // Refuses while it would throw away money still owed back or an order.voided not yet sent.
  async down(queryRunner: QueryRunner): Promise<void> {
    const [owed] = (await queryRunner.query(
      `SELECT (SELECT count(*) FROM "late_charge_refunds" WHERE "payment_id" IS NULL)
            + (SELECT count(*) FROM "order_events_outbox" WHERE "type" = 'order.voided') AS n`,
    )) as { n: string }[];
    if (Number(owed.n) > 0)
      throw new Error(`refusing to revert: ${owed.n} refunds of lost payments or order.voided events would be lost with it`);
    await queryRunner.query(`DROP TABLE "provider_charge_sweep"`);
    await queryRunner.query(
      `ALTER TABLE "order_events_outbox" DROP CONSTRAINT "${OUTBOX_TYPE}", ADD CONSTRAINT "${OUTBOX_TYPE}" CHECK ("type" IN (${OUTBOX_TYPES}))`,
    );
    await queryRunner.query(
      `ALTER TABLE "late_charge_refunds" DROP CONSTRAINT "${ONE_PAYMENT}", DROP COLUMN "lost_payment_id", ALTER COLUMN "payment_id" SET NOT NULL`,
    );
  }
}
