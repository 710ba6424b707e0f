import { Check, Column, Entity, Index, JoinColumn, ManyToOne, PrimaryGeneratedColumn } from 'typeorm';
import type { Order } from './order.entity.js';
import type { OrderStatus } from './order-status.js';

/** One status transition of an order (migration 1764414100000 says what each constraint prevents). */
@Entity('order_events')
@Index('ix_order_events_order_created', ['orderId', 'createdAt'])
@Check('ck_order_events_from_status', `"from_status" IN ('created', 'paid', 'cancelled', 'shipped', 'delivered', 'refunded')`)
@Check('ck_order_events_to_status', `"to_status" IN ('created', 'paid', 'cancelled', 'shipped', 'delivered', 'refunded')`)
@Check(
  'ck_order_events_transition',
  `("from_status", "to_status") IN (('created', 'paid'), ('created', 'cancelled'), ('paid', 'shipped'), ('paid', 'cancelled'), ('shipped', 'delivered'), ('cancelled', 'refunded'))`,
)
export class OrderEvent {
  @PrimaryGeneratedColumn('uuid', { primaryKeyConstraintName: 'pk_order_events' })
  id: string;

  @Column({ name: 'order_id', type: 'uuid' })
  orderId: string;

  @Column({ name: 'from_status', type: 'text' })
  fromStatus: OrderStatus;

  @Column({ name: 'to_status', type: 'text' })
  toStatus: OrderStatus;

  @Column({ name: 'created_at', type: 'timestamptz', default: () => 'now()' })
  createdAt: Date;

  @ManyToOne('Order', { onDelete: 'CASCADE' })
  @JoinColumn({ name: 'order_id', foreignKeyConstraintName: 'fk_order_events_order' })
  order: Order;
}
