import { Check, Column, Entity, Index, JoinColumn, ManyToOne, PrimaryGeneratedColumn, Unique } from 'typeorm';
import { bigintColumn } from '../orders/order-columns.js';
import type { Payment, PaymentStatus } from '../payments/payment.entity.js';

/**
 * A charge the provider made after we had failed its payment (a `charge.succeeded` that came too
 * late), or for a payment we do not have at all (lost in a failover), and the refund that gives the
 * money back (migrations 1764414700000 and 1764415800000 say what each constraint prevents). Its
 * id is the `refundId` the provider gets in the refund's metadata.
 */
@Entity('late_charge_refunds')
@Unique('uq_late_charge_refunds_charge', ['chargeId'])
@Unique('uq_late_charge_refunds_outbound_key', ['outboundKey'])
@Index('ix_late_charge_refunds_pending', ['nextAttemptAt'], { where: `"status" = 'pending'` })
@Check('ck_late_charge_refunds_status', `"status" IN ('pending', 'succeeded', 'failed')`)
@Check('ck_late_charge_refunds_amount_minor', `"amount_minor" > 0`)
@Check('ck_late_charge_refunds_one_payment', `num_nonnulls("payment_id", "lost_payment_id") = 1`)
export class LateChargeRefund {
  @PrimaryGeneratedColumn('uuid', { primaryKeyConstraintName: 'pk_late_charge_refunds' })
  id: string;

  @Column({ name: 'charge_id', type: 'text' })
  chargeId: string;

  /** The payment the charge was for; null when we lost it (lostPaymentId). */
  @Column({ name: 'payment_id', type: 'uuid', nullable: true })
  paymentId: string | null;

  /** The charge's metadata.paymentId when no such payment exists here: a failover lost it after its charge went out. */
  @Column({ name: 'lost_payment_id', type: 'uuid', nullable: true })
  lostPaymentId: string | null;

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
