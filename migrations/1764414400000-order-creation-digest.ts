import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * What an order was created from (src/orders/orders.service.ts, creationDigest): a create repeated
 * with the same order number is compared with this, not with the address and note, which PATCH
 * may have changed since.
 *
 * Nullable, no backfill: NULL means "created before this column existed", and the service then
 * compares with the current columns, as it did before. A backfill could not do better (it too
 * could only read the current, possibly edited, columns), would be a second implementation of the
 * canonical JSON in SQL that must match the service's byte for byte, and NOT NULL would make the
 * creates of an instance still running the previous build fail during a rolling deploy.
 */
export class OrderCreationDigest1764414400000 implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`ALTER TABLE "orders" ADD "creation_digest" text`);
    // A SHA-256 in lowercase hex or nothing: a digest in another form would silently match no
    // retry, turning every repeated create of the order into a 409.
    await queryRunner.query(`ALTER TABLE "orders" ADD CONSTRAINT "ck_orders_creation_digest" CHECK ("creation_digest" ~ '^[0-9a-f]{64}$')`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`ALTER TABLE "orders" DROP CONSTRAINT "ck_orders_creation_digest"`);
    await queryRunner.query(`ALTER TABLE "orders" DROP COLUMN "creation_digest"`);
  }
}
