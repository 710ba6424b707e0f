// Small batches keep each DELETE's locks and WAL short; a cap per run keeps one tick bounded
// (20 × 500 a minute keeps up with ~160 new rows a second; a backlog drains over later ticks).
export const DELETE_BATCH_SIZE = 500;
const MAX_BATCHES_PER_RUN = 20;

/** Calls `deleteBatch(DELETE_BATCH_SIZE)` until a batch comes back short (or the cap); returns how many rows went. */
export async function deleteInBatches(deleteBatch: (size: number) => Promise<number>): Promise<number> {
  let total = 0;
  for (let batch = 0; batch < MAX_BATCHES_PER_RUN; batch++) {
    const deleted = await deleteBatch(DELETE_BATCH_SIZE);
    total += deleted;
    if (deleted < DELETE_BATCH_SIZE) break;
  }
  return total;
}
