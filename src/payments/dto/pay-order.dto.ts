import { ApiProperty } from '@nestjs/swagger';
import { IsString, Matches } from 'class-validator';

/** What pays an order: a payment source at the provider. The amount is always the order's total. */
export class PayOrderDto {
  @ApiProperty({
    example: 'tok_visa',
    description:
      'A payment source at the provider. The sandbox knows tok_visa (succeeds), tok_chargeDeclined (declined), tok_flaky (fails twice, then succeeds), ' +
      'tok_timeout (first answer too late), tok_lost (every answer too late), tok_unavailable (provider down), tok_slow, ' +
      'tok_processing (in flight for a while, then succeeds), tok_refundDeclined.',
    maxLength: 64,
  })
  @IsString()
  @Matches(/^[A-Za-z0-9_]{1,64}$/, { message: 'source must be 1-64 letters, digits or underscores' })
  source: string;
}
