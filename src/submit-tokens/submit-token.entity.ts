import { Check, Column, Entity, Index, JoinColumn, ManyToOne, PrimaryColumn } from 'typeorm';
import type { Order } from '../orders/order.entity.js';

/**
 * A single-use permission to create one order (docs/contract.md#orders), issued with a short TTL. Consumed by
 * a conditional UPDATE in the transaction that inserts the order, which then records the order
 * here so a reuse can name it. (Migration 1764414300000 says what each constraint prevents.)
 */
@Entity('submit_tokens')
@Index('ix_submit_tokens_expires_at', ['expiresAt'])
@Check('ck_submit_tokens_order_only_when_consumed', `"order_id" IS NULL OR "consumed_at" IS NOT NULL`)
export class SubmitToken {
  /** 32 random bytes, base64url: unguessable, so holding the token is the proof it was issued. */
  @PrimaryColumn({ type: 'text', primaryKeyConstraintName: 'pk_submit_tokens' })
  token: string;

  @Column({ name: 'client_id', type: 'text' })
  clientId: string;

  @Column({ name: 'created_at', type: 'timestamptz', default: () => 'now()' })
  createdAt: Date;

  @Column({ name: 'expires_at', type: 'timestamptz' })
  expiresAt: Date;

  @Column({ name: 'consumed_at', type: 'timestamptz', nullable: true })
  consumedAt: Date | null;

  @Column({ name: 'order_id', type: 'uuid', nullable: true })
  orderId: string | null;

  @ManyToOne('Order', { onDelete: 'SET NULL', nullable: true })
  @JoinColumn({ name: 'order_id', foreignKeyConstraintName: 'fk_submit_tokens_order' })
  order: Order | null;
}
