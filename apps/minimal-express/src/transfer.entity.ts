import { Check, Column, CreateDateColumn, Entity, PrimaryGeneratedColumn } from 'typeorm';

/** The app's one entity: a transfer a client asks for, and must never get twice for one Idempotency-Key. */
@Entity('transfers')
@Check('ck_transfers_amount_positive', `"amount_minor" > 0`)
export class Transfer {
  @PrimaryGeneratedColumn('uuid', { primaryKeyConstraintName: 'pk_transfers' })
  id: string;

  @Column({ name: 'client_id', type: 'text' })
  clientId: string;

  @Column({ name: 'to_account', type: 'text' })
  toAccount: string;

  @Column({ name: 'amount_minor', type: 'integer' })
  amountMinor: number;

  @CreateDateColumn({ name: 'created_at', type: 'timestamptz' })
  createdAt: Date;
}
