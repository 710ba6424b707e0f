import type { ValueTransformer } from 'typeorm';

/**
 * `pg` returns BIGINT as a string, since it can exceed 2^53. Amounts here are bounded far below
 * that (see MAX_UNIT_PRICE_MINOR), so they are mapped to JSON numbers.
 */
export const bigintToNumber: ValueTransformer = {
  to: (value: number | null | undefined) => value,
  from: (value: string | null) => (value === null ? null : Number(value)),
};

export const bigintColumn = { type: 'bigint', transformer: bigintToNumber } as const;

/**
 * The columns of orders a statement reads, by name: a statement's result never follows the table,
 * so a column added or dropped while the service runs leaves every cached plan's result type as it was.
 */
export const ORDER_TABLE_COLUMNS =
  'id, order_number, status, currency, total_minor, shipping_address, note, version, created_at, updated_at';
