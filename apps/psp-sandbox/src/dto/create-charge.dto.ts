import { ApiProperty, ApiPropertyOptional } from '@nestjs/swagger';
import { Transform, Type } from 'class-transformer';
import { IsDefined, IsInt, IsObject, IsString, IsUUID, Matches, Max, MaxLength, Min, ValidateIf, ValidateNested } from 'class-validator';
import { TEST_TOKEN_NAMES } from '../test-tokens.js';

/** Amounts are exact JSON numbers and fit BIGINT: 2^53 - 1 is the largest both agree on. */
export const MAX_AMOUNT_MINOR = Number.MAX_SAFE_INTEGER;

/** PostgreSQL stores UUIDs lower-case: the answer to a POST and a later lookup spell them the same, and so do retries. */
export const lowerCase = ({ value }: { value: unknown }) => (typeof value === 'string' ? value.toLowerCase() : value);

export class ChargeMetadataDto {
  @ApiProperty({ format: 'uuid', example: '6f1c2a9e-3b4d-4c5e-8f70-112233445566', description: 'Your order id.' })
  @Transform(lowerCase)
  @IsUUID()
  orderId: string;

  @ApiProperty({ format: 'uuid', example: '0b7d5e1a-9c2f-4e3d-a1b0-998877665544', description: 'Your payment id.' })
  @Transform(lowerCase)
  @IsUUID()
  paymentId: string;

  @ApiPropertyOptional({
    maxLength: 64,
    example: 'c0ffee00-1234-4abc-8def-001122334455',
    description:
      'Which deployment of yours made the charge, when several share this account: returned with the charge and in its webhooks, ' +
      'so each can tell its own charges from the others.',
  })
  // Not @IsOptional(): that would let null through, stored as absent yet answered and fingerprinted as null.
  @ValidateIf((_: unknown, value: unknown) => value !== undefined)
  @Matches(/^[\x21-\x7e]{1,64}$/, { message: 'metadata.deploymentId must be 1 to 64 visible ASCII characters' })
  deploymentId?: string;
}

export class CreateChargeDto {
  @ApiProperty({ example: 2599, minimum: 1, maximum: MAX_AMOUNT_MINOR, description: 'Amount in minor units (cents).' })
  @IsInt()
  @Min(1)
  @Max(MAX_AMOUNT_MINOR)
  amountMinor: number;

  @ApiProperty({ example: 'EUR', pattern: '^[A-Z]{3}$', description: 'ISO 4217 code.' })
  @IsString()
  @Matches(/^[A-Z]{3}$/, { message: 'currency must be three upper-case letters (ISO 4217), such as EUR' })
  currency: string;

  @ApiProperty({ example: 'tok_visa', maxLength: 64, description: `A test token: ${TEST_TOKEN_NAMES.join(', ')}. Any other → 400.` })
  @IsString()
  @MaxLength(64)
  source: string;

  @ApiProperty({ type: ChargeMetadataDto })
  @IsDefined()
  @IsObject()
  @ValidateNested()
  @Type(() => ChargeMetadataDto)
  metadata: ChargeMetadataDto;
}
