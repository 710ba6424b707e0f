import { ApiProperty } from '@nestjs/swagger';
import type { PaymentStatus } from '../payment.entity.js';
import { PAYMENT_STATUSES } from './payment.view.js';

/** A refund of a payment (docs/contract.md#json-shapes). */
export class RefundView {
  @ApiProperty({ format: 'uuid' })
  id: string;

  @ApiProperty({ format: 'uuid' })
  paymentId: string;

  @ApiProperty({ example: 500 })
  amountMinor: number;

  @ApiProperty({ enum: PAYMENT_STATUSES, example: 'succeeded' })
  status: PaymentStatus;

  @ApiProperty({ type: 'string', nullable: true, example: 're_8c1d…' })
  providerRefundId: string | null;

  @ApiProperty({ type: 'string', nullable: true, example: null })
  failureCode: string | null;

  @ApiProperty({ format: 'date-time' })
  createdAt: string;
}

export class RefundList {
  @ApiProperty({ type: [RefundView] })
  items: RefundView[];
}
