import { ApiProperty } from '@nestjs/swagger';
import type { PaymentStatus } from '../payment.entity.js';

export const PAYMENT_STATUSES: readonly PaymentStatus[] = ['pending', 'succeeded', 'failed'];

/** No order total can exceed this (100 lines × 10 000 units × 10^9): below 2^53, so exact as a JSON number. */
export const MAX_ORDER_TOTAL_MINOR = 1e15;

/** A payment of an order (docs/contract.md#json-shapes). */
export class PaymentView {
  @ApiProperty({ format: 'uuid' })
  id: string;

  @ApiProperty({ format: 'uuid' })
  orderId: string;

  @ApiProperty({ enum: PAYMENT_STATUSES, example: 'succeeded' })
  status: PaymentStatus;

  @ApiProperty({ example: 2500 })
  amountMinor: number;

  @ApiProperty({ example: 'EUR' })
  currency: string;

  @ApiProperty({ example: 'sandbox' })
  provider: string;

  @ApiProperty({ type: 'string', nullable: true, example: 'ch_3f9a…', description: "The provider's charge id, once known." })
  providerTransactionId: string | null;

  @ApiProperty({ example: 0, description: 'Refunds reserved or settled, in minor units.' })
  refundedMinor: number;

  @ApiProperty({
    type: 'string',
    nullable: true,
    example: null,
    description: 'Why a failed payment failed: card_declined, invalid_source, provider_unreachable.',
  })
  failureCode: string | null;

  @ApiProperty({ format: 'date-time' })
  createdAt: string;

  @ApiProperty({ format: 'date-time' })
  updatedAt: string;
}

export class PaymentList {
  @ApiProperty({ type: [PaymentView] })
  items: PaymentView[];
}
