import { Check, Column, Entity, JoinColumn, ManyToOne, PrimaryColumn } from 'typeorm';
import type { Order } from './order.entity.js';
import { bigintColumn } from './order-columns.js';

@Entity('order_items')
@Check('ck_order_items_quantity', `"quantity" BETWEEN 1 AND 10000`)
@Check('ck_order_items_unit_price_minor', `"unit_price_minor" >= 0`)
export class OrderItem {
  // (order_id, line_no) is the key: a line is written once, never duplicated by a repeated insert.
  @PrimaryColumn({ name: 'order_id', type: 'uuid', primaryKeyConstraintName: 'pk_order_items' })
  orderId: string;

  @PrimaryColumn({ name: 'line_no', type: 'integer', primaryKeyConstraintName: 'pk_order_items' })
  lineNo: number;

  @Column({ type: 'text' })
  sku: string;

  @Column({ type: 'integer' })
  quantity: number;

  @Column({ name: 'unit_price_minor', ...bigintColumn })
  unitPriceMinor: number;

  @ManyToOne('Order', (order: Order) => order.items, { onDelete: 'CASCADE' })
  @JoinColumn({ name: 'order_id', foreignKeyConstraintName: 'fk_order_items_order' })
  order: Order;
}
