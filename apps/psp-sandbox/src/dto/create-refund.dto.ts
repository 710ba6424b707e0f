import { ApiProperty } from '@nestjs/swagger';
import { Transform, Type } from 'class-transformer';
import { IsDefined, IsInt, IsObject, IsString, IsUUID, Matches, Max, Min, ValidateNested } from 'class-validator';
import { lowerCase, MAX_AMOUNT_MINOR } from './create-charge.dto.js';

/** What the sandbox's ids look like ("ch_" + 24 hex digits); anything else cannot name a charge. */
export const CHARGE_ID_PATTERN = /^ch_[0-9a-f]{24}$/;

export class RefundMetadataDto {
  @ApiProperty({ format: 'uuid', example: '3c9d8e7f-6a5b-4c3d-9e2f-0a1b2c3d4e5f', description: 'Your refund id.' })
  @Transform(lowerCase)
  @IsUUID()
  refundId: string;

  @ApiProperty({ format: 'uuid', example: '0b7d5e1a-9c2f-4e3d-a1b0-998877665544', description: 'Your payment id.' })
  @Transform(lowerCase)
  @IsUUID()
  paymentId: string;
}

export class CreateRefundDto {
  @ApiProperty({ example: 'ch_5f0c3e2a1b9d8c7e6f5a4b3c', pattern: CHARGE_ID_PATTERN.source })
  @IsString()
  @Matches(CHARGE_ID_PATTERN, { message: 'chargeId must be a sandbox charge id such as ch_5f0c3e2a1b9d8c7e6f5a4b3c' })
  chargeId: string;

  @ApiProperty({
    example: 1000,
    minimum: 1,
    maximum: MAX_AMOUNT_MINOR,
    description: 'Amount in minor units; at most what remains refundable.',
  })
  @IsInt()
  @Min(1)
  @Max(MAX_AMOUNT_MINOR)
  amountMinor: number;

  @ApiProperty({ type: RefundMetadataDto })
  @IsDefined()
  @IsObject()
  @ValidateNested()
  @Type(() => RefundMetadataDto)
  metadata: RefundMetadataDto;
}
