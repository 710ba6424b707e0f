import { ApiProperty } from '@nestjs/swagger';
import { RefundMetadataDto } from './create-refund.dto.js';

/** A refund as the provider answers it (`PspRefund` in src/psp-client/psp-wire.ts). */
export class PspRefundView {
  @ApiProperty({ example: 're_9a8b7c6d5e4f3a2b1c0d9e8f', pattern: '^re_[0-9a-f]{24}$' })
  id: string;

  @ApiProperty({ enum: ['succeeded', 'failed'], example: 'succeeded' })
  status: 'succeeded' | 'failed';

  @ApiProperty({ example: 'ch_5f0c3e2a1b9d8c7e6f5a4b3c' })
  chargeId: string;

  @ApiProperty({ example: 1000 })
  amountMinor: number;

  @ApiProperty({ type: String, nullable: true, example: null, description: '"refund_declined" when failed.' })
  failureCode: string | null;

  @ApiProperty({ type: RefundMetadataDto })
  metadata: RefundMetadataDto;

  @ApiProperty({ format: 'date-time', example: '2026-11-30T12:05:00.000Z' })
  createdAt: string;
}

export class PspRefundList {
  @ApiProperty({ type: [PspRefundView] })
  items: PspRefundView[];
}
