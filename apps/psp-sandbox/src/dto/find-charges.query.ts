import { ApiPropertyOptional } from '@nestjs/swagger';
import { Transform } from 'class-transformer';
import { IsOptional, IsUUID } from 'class-validator';
import { lowerCase } from './create-charge.dto.js';

export class FindChargesQuery {
  @ApiPropertyOptional({ format: 'uuid', description: 'Charges whose metadata.orderId is this.' })
  @IsOptional()
  @Transform(lowerCase)
  @IsUUID()
  orderId?: string;

  @ApiPropertyOptional({ format: 'uuid', description: 'Charges whose metadata.paymentId is this.' })
  @IsOptional()
  @Transform(lowerCase)
  @IsUUID()
  paymentId?: string;
}
