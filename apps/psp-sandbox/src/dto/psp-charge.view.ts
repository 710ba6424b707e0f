import { ApiProperty } from '@nestjs/swagger';
import { ChargeMetadataDto } from './create-charge.dto.js';

/** A charge as the provider answers it (`PspCharge` in src/psp-client/psp-wire.ts). */
export class PspChargeView {
  @ApiProperty({ example: 'ch_5f0c3e2a1b9d8c7e6f5a4b3c', pattern: '^ch_[0-9a-f]{24}$' })
  id: string;

  @ApiProperty({ enum: ['succeeded', 'failed'], example: 'succeeded' })
  status: 'succeeded' | 'failed';

  @ApiProperty({ example: 2599 })
  amountMinor: number;

  @ApiProperty({ example: 'EUR' })
  currency: string;

  @ApiProperty({ example: 'tok_visa' })
  source: string;

  @ApiProperty({ type: String, nullable: true, example: null, description: '"card_declined" when failed.' })
  failureCode: string | null;

  @ApiProperty({ type: ChargeMetadataDto })
  metadata: ChargeMetadataDto;

  @ApiProperty({ format: 'date-time', example: '2026-11-30T12:00:00.000Z' })
  createdAt: string;
}

export class PspChargeList {
  @ApiProperty({ type: [PspChargeView], description: 'Ordered by createdAt, then id.' })
  items: PspChargeView[];

  @ApiProperty({
    example: false,
    description:
      "Listing: true when charges follow this page (ask again with startingAfter = this page's last id). Always false for a lookup.",
  })
  hasMore: boolean;
}
