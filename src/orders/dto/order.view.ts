import { ApiProperty } from '@nestjs/swagger';
import { ORDER_STATUSES, type OrderStatus } from '../order-status.js';
import { OrderItemDto, ShippingAddressDto } from './create-order.dto.js';

/** An order as the API shows it (docs/contract.md#json-shapes). */
export class OrderView {
  @ApiProperty({ format: 'uuid' })
  id: string;

  @ApiProperty({ example: 'PO-2026-0001' })
  orderNumber: string;

  @ApiProperty({ enum: ORDER_STATUSES, example: 'created' })
  status: OrderStatus;

  @ApiProperty({ example: 'EUR' })
  currency: string;

  @ApiProperty({ example: 3998, description: 'Sum of quantity × unitPriceMinor, computed by the server.' })
  totalMinor: number;

  @ApiProperty({ type: [OrderItemDto] })
  items: OrderItemDto[];

  @ApiProperty({ type: ShippingAddressDto, nullable: true })
  shippingAddress: ShippingAddressDto | null;

  @ApiProperty({ type: String, nullable: true, example: 'Leave at the door' })
  note: string | null;

  @ApiProperty({ example: 1, description: 'Grows by one on every change; sent as the ETag in quotes (version 3: "3").' })
  version: number;

  @ApiProperty({ format: 'date-time' })
  createdAt: string;

  @ApiProperty({ format: 'date-time' })
  updatedAt: string;
}

export class OrderPage {
  @ApiProperty({ type: [OrderView] })
  items: OrderView[];

  @ApiProperty({ type: String, nullable: true, description: 'Pass as ?cursor= for the next page; null on the last page.' })
  nextCursor: string | null;
}
