import { Check, Column, Entity, Index, JoinColumn, ManyToOne, PrimaryGeneratedColumn, Unique } from 'typeorm';
import type { IdempotencyKey } from '@idempotent-orders/idempotency';
import type { Order } from '../orders/order.entity.js';
import { bigintColumn } from '../orders/order-columns.js';

export type PaymentStatus = 'pending' | 'succeeded' | 'failed';

/** A charge of an order through the provider (migration 1764414600000 says what each constraint prevents). */
@Entity('payments')
@Unique('uq_payments_provider_transaction', ['provider', 'providerTransactionId'])
@Unique('uq_payments_outbound_key', ['outboundKey'])
@Index('ux_payments_one_active_per_order', ['orderId'], { unique: true, where: `"status" IN ('pending', 'succeeded')` })
@Index('ix_payments_order_created', ['orderId', 'createdAt'])
@Index('ix_payments_idempotency_key', ['idempotencyKeyId'])
// Created by the webhooks migration (1764414700000) for the oldest-pending gauge.
@Index('ix_payments_pending_created', ['createdAt'], { where: `"status" = 'pending'` })
// Created by the unreached-sweep migration (1764415100000) for the sweep's look for rows an older build failed as never reached.
@Index('ix_payments_unreached', ['updatedAt'], { where: `"status" = 'failed' AND "failure_code" = 'provider_unreachable'` })
@Check('ck_payments_status', `"status" IN ('pending', 'succeeded', 'failed')`)
@Check('ck_payments_amount_minor', `"amount_minor" > 0`)
@Check('ck_payments_currency', `"currency" ~ '^[A-Z]{3}$'`)
@Check('ck_payments_succeeded_has_charge', `"status" <> 'succeeded' OR "provider_transaction_id" IS NOT NULL`)
@Check('ck_payments_refunded_minor', `"refunded_minor" BETWEEN 0 AND "amount_minor"`)
export class Payment {
  @PrimaryGeneratedColumn('uuid', { primaryKeyConstraintName: 'pk_payments' })
  id: string;

  @Column({ name: 'client_id', type: 'text' })
  clientId: string;

  @Column({ name: 'order_id', type: 'uuid' })
  orderId: string;

  @Column({ name: 'idempotency_key_id', type: 'uuid', nullable: true })
  idempotencyKeyId: string | null;

  @Column({ type: 'text', default: 'pending' })
  status: PaymentStatus;

  @Column({ name: 'amount_minor', ...bigintColumn })
  amountMinor: number;

  @Column({ type: 'text' })
  currency: string;

  @Column({ type: 'text' })
  source: string;

  @Column({ type: 'text', default: 'sandbox' })
  provider: string;

  @Column({ name: 'provider_transaction_id', type: 'text', nullable: true })
  providerTransactionId: string | null;

  @Column({ name: 'outbound_key', type: 'text' })
  outboundKey: string;

  @Column({ name: 'refunded_minor', ...bigintColumn, default: 0 })
  refundedMinor: number;

  @Column({ name: 'failure_code', type: 'text', nullable: true })
  failureCode: string | null;

  @Column({ name: 'created_at', type: 'timestamptz', default: () => 'now()' })
  createdAt: Date;

  @Column({ name: 'updated_at', type: 'timestamptz', default: () => 'now()' })
  updatedAt: Date;

  @ManyToOne('Order', { onDelete: 'RESTRICT' })
  @JoinColumn({ name: 'order_id', foreignKeyConstraintName: 'fk_payments_order' })
  order?: Order;

  @ManyToOne('IdempotencyKey', { onDelete: 'SET NULL' })
  @JoinColumn({ name: 'idempotency_key_id', foreignKeyConstraintName: 'fk_payments_idempotency_key' })
  idempotencyKey?: IdempotencyKey | null;
}
