import { setTimeout as sleep } from 'node:timers/promises';
import type { FastifyReply } from 'fastify';

/**
 * A test-only hook for the conformance kit (docs/conformance.md#holding-a-request-in-its-window): with
 * CONFORMANCE_HOOKS=1, a create sent with `Conformance-Hold: <ms>` answers `102 Processing` once its writes are
 * done and waits that long before its transaction commits, so the kit can kill the process or race a duplicate
 * inside that window every time instead of by chance. Off by default; any other value of the variable stops start-up.
 */
// Read from the request, not a @Headers() parameter: that would publish the hook in the OpenAPI document.
const CONFORMANCE_HOLD_HEADER = 'conformance-hold';
const MAX_HOLD_MS = 60_000;

const setting = process.env.CONFORMANCE_HOOKS;
if (setting !== undefined && setting !== '' && setting !== '0' && setting !== '1') {
  throw new Error(`CONFORMANCE_HOOKS must be 1 (the conformance kit's test hooks) or unset, got ${JSON.stringify(setting)}`);
}
const enabled = setting === '1';

/** Waits the requested time after the handler's writes, when the hooks are on and the request asks for it. */
export async function holdForConformance(res: FastifyReply): Promise<void> {
  const header = res.request.headers[CONFORMANCE_HOLD_HEADER];
  if (!enabled || typeof header !== 'string') return;
  const ms = Number(header);
  if (!Number.isInteger(ms) || ms < 0 || ms > MAX_HOLD_MS) return;
  // The 1xx tells the kit the request is inside its window: no guessing by time.
  res.raw.writeProcessing();
  await sleep(ms);
}
