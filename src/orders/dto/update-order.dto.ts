import { ApiPropertyOptional } from '@nestjs/swagger';
import { Type } from 'class-transformer';
import { IsObject, IsOptional, IsString, MaxLength, ValidateIf, ValidateNested } from 'class-validator';
import { ShippingAddressDto } from './create-order.dto.js';

/** PATCH /orders/:id. An absent field is left as it is; at least one must be sent (checked by the service). */
export class UpdateOrderDto {
  @ApiPropertyOptional({ type: ShippingAddressDto, description: 'Replaces the whole address.' })
  // Present means "replace": null is refused rather than read as "clear", which only note allows.
  @ValidateIf((dto: UpdateOrderDto) => dto.shippingAddress !== undefined)
  @IsObject()
  @ValidateNested()
  @Type(() => ShippingAddressDto)
  shippingAddress?: ShippingAddressDto;

  @ApiPropertyOptional({
    type: String,
    nullable: true,
    maxLength: 1000,
    example: 'Leave with the neighbour',
    description: 'null clears the note.',
  })
  @IsOptional()
  @IsString()
  @MaxLength(1000)
  note?: string | null;
}
