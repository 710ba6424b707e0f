import type { MigrationInterface, QueryRunner } from 'typeorm';

const ONE_PAYMENT = 'ck_late_charge_refunds_one_payment';
const OUTBOX_TYPE = 'ck_order_events_outbox_type';

/**
 * Money at the provider that our books do not know (docs/running-it.md, "Beyond one node"): a database failover with
 * asynchronous replication can lose a payment whose charge went out. Its charge is refunded like a late charge, by a
 * late_charge_refunds row that names the lost payment's id instead of referencing a payment row; and the order that
 * vanished with it is announced as `order.voided`, so fulfilment cancels what it shipped for it.
 *
 * Safe while old processes serve: the column is nullable with no default (nothing rewritten); the checks are added NOT
 * VALID and then validated, which scans without holding off writes; every row an old process writes satisfies both
 * (it always sets payment_id, and writes only the four event types it knows). An old process's retry job joins
 * payments, so it leaves a lost payment's refund to a new process.
 */
export class UnrecordedProviderMoney1764415800000 implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`ALTER TABLE "late_charge_refunds" ALTER COLUMN "payment_id" DROP NOT NULL, ADD COLUMN "lost_payment_id" uuid`);
    // Exactly one of the two: a refund is for a payment we hold, or for one the provider charged and we lost — never
    // neither (a refund nobody can trace) nor both.
    await queryRunner.query(
      `ALTER TABLE "late_charge_refunds" ADD CONSTRAINT "${ONE_PAYMENT}" CHECK (num_nonnulls("payment_id", "lost_payment_id") = 1) NOT VALID`,
    );
    await queryRunner.query(`ALTER TABLE "late_charge_refunds" VALIDATE CONSTRAINT "${ONE_PAYMENT}"`);
    // The contract's fifth type; still only the contract's types, so the routing key is always one a consumer knows.
    await queryRunner.query(
      `ALTER TABLE "order_events_outbox" DROP CONSTRAINT "${OUTBOX_TYPE}",
         ADD CONSTRAINT "${OUTBOX_TYPE}" CHECK ("type" IN ('order.created', 'order.paid', 'order.cancelled', 'order.refunded', 'order.voided')) NOT VALID`,
    );
    await queryRunner.query(`ALTER TABLE "order_events_outbox" VALIDATE CONSTRAINT "${OUTBOX_TYPE}"`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DELETE FROM "order_events_outbox" WHERE "type" = 'order.voided'`);
    await queryRunner.query(
      `ALTER TABLE "order_events_outbox" DROP CONSTRAINT "${OUTBOX_TYPE}",
         ADD CONSTRAINT "${OUTBOX_TYPE}" CHECK ("type" IN ('order.created', 'order.paid', 'order.cancelled', 'order.refunded'))`,
    );
    await queryRunner.query(`DELETE FROM "late_charge_refunds" WHERE "payment_id" IS NULL`);
    await queryRunner.query(
      `ALTER TABLE "late_charge_refunds" DROP CONSTRAINT "${ONE_PAYMENT}", DROP COLUMN "lost_payment_id", ALTER COLUMN "payment_id" SET NOT NULL`,
    );
  }
}
