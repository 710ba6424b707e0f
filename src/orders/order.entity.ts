import { Check, Column, Entity, Index, OneToMany, PrimaryGeneratedColumn, Unique } from 'typeorm';
import type { OrderItem } from './order-item.entity.js';
import { bigintColumn } from './order-columns.js';
import type { OrderStatus } from './order-status.js';

@Entity('orders')
// The natural key: one order per (client, order number), however often a create is repeated.
@Unique('uq_orders_client_order_number', ['clientId', 'orderNumber'])
// Keyset pagination walks (created_at, id) newest first, per client, optionally per status.
@Index('ix_orders_client_created', ['clientId', 'createdAt', 'id'])
@Index('ix_orders_client_status_created', ['clientId', 'status', 'createdAt', 'id'])
@Check('ck_orders_status', `"status" IN ('created', 'paid', 'cancelled', 'shipped', 'delivered', 'refunded')`)
@Check('ck_orders_currency', `"currency" ~ '^[A-Z]{3}$'`)
@Check('ck_orders_total_minor', `"total_minor" >= 0`)
@Check('ck_orders_version', `"version" >= 1`)
@Check('ck_orders_creation_digest', `"creation_digest" ~ '^[0-9a-f]{64}$'`)
export class Order {
  @PrimaryGeneratedColumn('uuid', { primaryKeyConstraintName: 'pk_orders' })
  id: string;

  @Column({ name: 'client_id', type: 'text' })
  clientId: string;

  @Column({ name: 'order_number', type: 'text' })
  orderNumber: string;

  @Column({ type: 'text', default: 'created' })
  status: OrderStatus;

  @Column({ type: 'text' })
  currency: string;

  @Column({ name: 'total_minor', ...bigintColumn })
  totalMinor: number;

  @Column({ name: 'shipping_address', type: 'jsonb', nullable: true })
  shippingAddress: Record<string, string> | null;

  @Column({ type: 'text', nullable: true })
  note: string | null;

  /** SHA-256 (hex) of the create's canonical content; null for orders made before migration 1764414400000. */
  @Column({ name: 'creation_digest', type: 'text', nullable: true })
  creationDigest: string | null;

  @Column({ type: 'integer', default: 1 })
  version: number;

  @Column({ name: 'created_at', type: 'timestamptz', default: () => 'now()' })
  createdAt: Date;

  @Column({ name: 'updated_at', type: 'timestamptz', default: () => 'now()' })
  updatedAt: Date;

  @OneToMany('OrderItem', (item: OrderItem) => item.order)
  items: OrderItem[];
}
