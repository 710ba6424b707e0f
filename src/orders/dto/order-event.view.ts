import { ApiProperty } from '@nestjs/swagger';
import { ORDER_STATUSES, type OrderStatus } from '../order-status.js';

/** One status transition of an order (docs/contract.md#json-shapes). */
export class OrderEventView {
  @ApiProperty({ format: 'uuid' })
  id: string;

  @ApiProperty({ format: 'uuid' })
  orderId: string;

  @ApiProperty({ enum: ORDER_STATUSES, example: 'created' })
  fromStatus: OrderStatus;

  @ApiProperty({ enum: ORDER_STATUSES, example: 'cancelled' })
  toStatus: OrderStatus;

  @ApiProperty({ format: 'date-time' })
  createdAt: string;
}
