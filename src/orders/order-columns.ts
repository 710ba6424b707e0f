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
