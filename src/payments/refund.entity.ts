import { Check, Column, Entity, Index, JoinColumn, ManyToOne, PrimaryGeneratedColumn, Unique } from 'typeorm';
import type { IdempotencyKey } from '@idempotent-orders/idempotency';
import { bigintColumn } from '../orders/order-columns.js';
import type { Payment, PaymentStatus } from './payment.entity.js';

/** A full or partial refund of a payment (migration 1764414600000 says what each constraint prevents). */
@Entity('refunds')
@Unique('uq_refunds_provider_refund', ['provider', 'providerRefundId'])
@Unique('uq_refunds_outbound_key', ['outboundKey'])
@Index('ix_refunds_payment_created', ['paymentId', 'createdAt'])
@Index('ix_refunds_idempotency_key', ['idempotencyKeyId'])
// Created by the webhooks migration (1764414700000) for the oldest-pending gauge.
@Index('ix_refunds_pending_created', ['createdAt'], { where: `"status" = 'pending'` })
// Created by the unreached-sweep migration (1764415100000) for the sweep's look for rows an older build failed as never reached.
@Index('ix_refunds_unreached', ['updatedAt'], { where: `"status" = 'failed' AND "failure_code" = 'provider_unreachable'` })
@Check('ck_refunds_status', `"status" IN ('pending', 'succeeded', 'failed')`)
@Check('ck_refunds_amount_minor', `"amount_minor" > 0`)
@Check('ck_refunds_succeeded_has_provider_refund', `"status" <> 'succeeded' OR "provider_refund_id" IS NOT NULL`)
export class Refund {
  @PrimaryGeneratedColumn('uuid', { primaryKeyConstraintName: 'pk_refunds' })
  id: string;

  @Column({ name: 'client_id', type: 'text' })
  clientId: string;

  @Column({ name: 'payment_id', type: 'uuid' })
  paymentId: string;

  @Column({ name: 'idempotency_key_id', type: 'uuid', nullable: true })
  idempotencyKeyId: string | null;

  @Column({ type: 'text', default: 'pending' })
  status: PaymentStatus;

  @Column({ name: 'amount_minor', ...bigintColumn })
  amountMinor: number;

  @Column({ type: 'text', default: 'sandbox' })
  provider: string;

  @Column({ name: 'provider_refund_id', type: 'text', nullable: true })
  providerRefundId: string | null;

  @Column({ name: 'outbound_key', type: 'text' })
  outboundKey: string;

  @Column({ name: 'failure_code', type: 'text', nullable: true })
  failureCode: string | null;

  @Column({ name: 'created_at', type: 'timestamptz', default: () => 'now()' })
  createdAt: Date;

  @Column({ name: 'updated_at', type: 'timestamptz', default: () => 'now()' })
  updatedAt: Date;

  @ManyToOne('Payment', { onDelete: 'RESTRICT' })
  @JoinColumn({ name: 'payment_id', foreignKeyConstraintName: 'fk_refunds_payment' })
  payment?: Payment;

  @ManyToOne('IdempotencyKey', { onDelete: 'SET NULL' })
  @JoinColumn({ name: 'idempotency_key_id', foreignKeyConstraintName: 'fk_refunds_idempotency_key' })
  idempotencyKey?: IdempotencyKey | null;
}
