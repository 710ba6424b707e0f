/** The order total fail-inserts.ts makes fail: the 5xx check's body totals this. */
export const FAILING_TOTAL = 4242;
