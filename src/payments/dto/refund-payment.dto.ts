import { ApiPropertyOptional } from '@nestjs/swagger';
import { IsInt, IsOptional, Max, Min } from 'class-validator';
import { MAX_ORDER_TOTAL_MINOR } from './payment.view.js';

/** A full refund (no amount: what remains) or a partial one. */
export class RefundPaymentDto {
  @ApiPropertyOptional({ example: 500, minimum: 1, description: 'Minor units to refund; default: everything not yet refunded.' })
  @IsOptional()
  @IsInt()
  @Min(1)
  @Max(MAX_ORDER_TOTAL_MINOR)
  amountMinor?: number;
}
