import type { MigrationInterface, QueryRunner } from 'typeorm';

const SEALED_CHECK = 'ck_idempotency_keys_sealed_answer';

/**
 * Stored answers encrypted at rest (IdempotencyModuleOptions.responseEncryption; docs/running-it.md, "Stored answers
 * encrypted at rest"). Two nullable columns, no default: adding them rewrites nothing, and an older build still serving
 * names its columns in every statement, so it reads and writes as before. A row it writes has no sealed answer; a row
 * a new build seals holds a placeholder in the plain columns (a retryable 503) for an older build to replay.
 */
export class StoredAnswerEncryption1764415600000 implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
    // response_key_id: the id of the key that sealed response_sealed (IDEMPOTENCY_ENCRYPTION_KEYS); NULL: stored in plain.
    // response_sealed: the answer (status, headers, body) sealed with AES-256-GCM — version byte, 12-byte IV, 16-byte
    // tag, ciphertext — bound to the row id; when set, the plain response_* columns hold only a placeholder.
    await queryRunner.query(`ALTER TABLE "idempotency_keys" ADD COLUMN "response_key_id" text, ADD COLUMN "response_sealed" bytea`);
    // A sealed answer belongs to one completed answer of its row. An older build taking an expired key over does not
    // know the column and would leave the previous answer's seal beside its own plain one, to be replayed for the new
    // request by a newer build: that take-over fails instead (its request is retried), and no stale seal survives.
    // NOT VALID, then validated: the check scans the table without holding off its writes.
    await queryRunner.query(
      `ALTER TABLE "idempotency_keys" ADD CONSTRAINT "${SEALED_CHECK}" CHECK ("response_sealed" IS NULL OR ("state" = 'completed' AND "response_key_id" IS NOT NULL)) NOT VALID`,
    );
    await queryRunner.query(`ALTER TABLE "idempotency_keys" VALIDATE CONSTRAINT "${SEALED_CHECK}"`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(
      `ALTER TABLE "idempotency_keys" DROP CONSTRAINT "${SEALED_CHECK}", DROP COLUMN "response_sealed", DROP COLUMN "response_key_id"`,
    );
  }
}
