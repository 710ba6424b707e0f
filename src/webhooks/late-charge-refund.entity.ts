import { Check, Column, Entity, Index, JoinColumn, ManyToOne, PrimaryGeneratedColumn, Unique } from 'typeorm';
import { bigintColumn } from '../orders/order-columns.js';
import type { Payment, PaymentStatus } from '../payments/payment.entity.js';

/**
 * A charge the provider made after we had failed its payment (a `charge.succeeded` that came too
 * late), and the refund that gives the money back (migration 1764414700000 says what each
 * constraint prevents). Its id is the `refundId` the provider gets in the refund's metadata.
 */
@Entity('late_charge_refunds')
@Unique('uq_late_charge_refunds_charge', ['chargeId'])
@Unique('uq_late_charge_refunds_outbound_key', ['outboundKey'])
@Index('ix_late_charge_refunds_pending', ['nextAttemptAt'], { where: `"status" = 'pending'` })
@Check('ck_late_charge_refunds_status', `"status" IN ('pending', 'succeeded', 'failed')`)
@Check('ck_late_charge_refunds_amount_minor', `"amount_minor" > 0`)
export class LateChargeRefund {
  @PrimaryGeneratedColumn('uuid', { primaryKeyConstraintName: 'pk_late_charge_refunds' })
  id: string;

  @Column({ name: 'charge_id', type: 'text' })
  chargeId: string;

  @Column({ name: 'payment_id', type: 'uuid' })
  paymentId: string;

  @Column({ name: 'amount_minor', ...bigintColumn })
  amountMinor: number;

  @Column({ name: 'outbound_key', type: 'text' })
  outboundKey: string;

  @Column({ type: 'text', default: 'pending' })
  status: PaymentStatus;

  @Column({ name: 'provider_refund_id', type: 'text', nullable: true })
  providerRefundId: string | null;

  @Column({ name: 'failure_code', type: 'text', nullable: true })
  failureCode: string | null;

  @Column({ type: 'integer', default: 0 })
  attempts: number;

  @Column({ name: 'next_attempt_at', type: 'timestamptz', default: () => 'now()' })
  nextAttemptAt: Date;

  @Column({ name: 'created_at', type: 'timestamptz', default: () => 'now()' })
  createdAt: Date;

  @Column({ name: 'updated_at', type: 'timestamptz', default: () => 'now()' })
  updatedAt: Date;

  @ManyToOne('Payment', { onDelete: 'RESTRICT' })
  @JoinColumn({ name: 'payment_id', foreignKeyConstraintName: 'fk_late_charge_refunds_payment' })
  payment?: Payment;
}
