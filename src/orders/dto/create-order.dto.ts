import { ApiProperty, ApiPropertyOptional } from '@nestjs/swagger';
import { Type } from 'class-transformer';
import {
  ArrayMaxSize,
  ArrayMinSize,
  IsArray,
  IsIn,
  IsInt,
  IsObject,
  IsOptional,
  IsString,
  Matches,
  Max,
  MaxLength,
  Min,
  ValidateNested,
} from 'class-validator';

/** ISO 4217 codes, as this Node.js knows them. */
export const CURRENCIES: readonly string[] = Intl.supportedValuesOf('currency');

/**
 * 10^9 minor units (ten million in a two-decimal currency) per unit. With at most 100 lines of
 * 10 000 units, a total stays below 10^15 < 2^53: every amount is exact as a JSON number.
 */
export const MAX_UNIT_PRICE_MINOR = 1_000_000_000;
export const MAX_ITEMS = 100;
export const MAX_QUANTITY = 10_000;

export const ORDER_NUMBER_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$/;

export class OrderItemDto {
  @ApiProperty({ example: 'SKU-1001', minLength: 1, maxLength: 64 })
  @IsString()
  @Matches(/^[\x21-\x7E]{1,64}$/, { message: 'sku must be 1-64 visible ASCII characters' })
  sku: string;

  @ApiProperty({ example: 2, minimum: 1, maximum: MAX_QUANTITY })
  @IsInt()
  @Min(1)
  @Max(MAX_QUANTITY)
  quantity: number;

  @ApiProperty({ example: 1999, minimum: 0, maximum: MAX_UNIT_PRICE_MINOR, description: 'Price of one unit in minor units (cents).' })
  @IsInt()
  @Min(0)
  @Max(MAX_UNIT_PRICE_MINOR)
  unitPriceMinor: number;
}

export class ShippingAddressDto {
  @ApiProperty({ example: 'Ada Lovelace', maxLength: 200 })
  @IsString()
  @MaxLength(200)
  name: string;

  @ApiProperty({ example: '12 St James Square', maxLength: 200 })
  @IsString()
  @MaxLength(200)
  line1: string;

  @ApiPropertyOptional({ example: 'Flat 3', maxLength: 200 })
  @IsOptional()
  @IsString()
  @MaxLength(200)
  line2?: string;

  @ApiProperty({ example: 'London', maxLength: 100 })
  @IsString()
  @MaxLength(100)
  city: string;

  @ApiProperty({ example: 'SW1Y 4JH', maxLength: 20 })
  @IsString()
  @MaxLength(20)
  postalCode: string;

  @ApiProperty({ example: 'GB', description: 'ISO 3166-1 alpha-2 country code' })
  @Matches(/^[A-Z]{2}$/, { message: 'country must be an ISO 3166-1 alpha-2 code such as GB' })
  country: string;
}

export class CreateOrderDto {
  @ApiPropertyOptional({
    example: 'PO-2026-0001',
    description:
      'Your own order number, unique per client: a create repeated with the same number and content returns the existing order (200); different content is a 409. Generated when omitted.',
    pattern: ORDER_NUMBER_PATTERN.source,
  })
  @IsOptional()
  @IsString()
  @Matches(ORDER_NUMBER_PATTERN, { message: 'orderNumber must be 1-64 of A-Z a-z 0-9 . _ : - and start with a letter or digit' })
  orderNumber?: string;

  @ApiProperty({ example: 'EUR', description: 'ISO 4217 currency code' })
  @IsIn(CURRENCIES, { message: 'currency must be an ISO 4217 code such as EUR' })
  currency: string;

  @ApiProperty({ type: [OrderItemDto], minItems: 1, maxItems: MAX_ITEMS })
  @IsArray()
  @ArrayMinSize(1)
  @ArrayMaxSize(MAX_ITEMS)
  // Each line an object: ValidateNested alone walks into a nested array ([[{…}]]) and lets it through to PostgreSQL.
  @IsObject({ each: true })
  @ValidateNested({ each: true })
  @Type(() => OrderItemDto)
  items: OrderItemDto[];

  @ApiPropertyOptional({ type: ShippingAddressDto })
  @IsOptional()
  @ValidateNested()
  @Type(() => ShippingAddressDto)
  shippingAddress?: ShippingAddressDto;

  @ApiPropertyOptional({ example: 'Leave at the door', maxLength: 1000 })
  @IsOptional()
  @IsString()
  @MaxLength(1000)
  note?: string;
}
