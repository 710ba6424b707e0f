import { ApiPropertyOptional } from '@nestjs/swagger';
import { Transform } from 'class-transformer';
import { IsOptional, IsUUID, Matches } from 'class-validator';
import { lowerCase } from './create-charge.dto.js';
import { CHARGE_ID_PATTERN } from './create-refund.dto.js';

export class FindRefundsQuery {
  @ApiPropertyOptional({ pattern: CHARGE_ID_PATTERN.source, description: 'Refunds of this charge.' })
  @IsOptional()
  @Matches(CHARGE_ID_PATTERN, { message: 'chargeId must be a sandbox charge id such as ch_5f0c3e2a1b9d8c7e6f5a4b3c' })
  chargeId?: string;

  @ApiPropertyOptional({ format: 'uuid', description: 'Refunds whose metadata.refundId is this.' })
  @IsOptional()
  @Transform(lowerCase)
  @IsUUID()
  refundId?: string;
}
