import { applyDecorators, SetMetadata, UseInterceptors } from '@nestjs/common';
import { IdempotencyInterceptor } from './idempotency.interceptor.js';
import { IDEMPOTENT, type IdempotentOptions } from './idempotent-route.js';

export { IDEMPOTENT, type IdempotentOptions } from './idempotent-route.js';

/**
 * Makes a POST or PATCH safe to retry under an Idempotency-Key: the first request runs and
 * its response is stored in the same transaction as its writes; a retry with the same key gets
 * that response again (`Idempotent-Replayed: true`), never a second execution. The handler writes
 * through `Database` (`manager`, `getRepository`, `query`) to be part of that transaction.
 */
export function Idempotent(options: IdempotentOptions = {}) {
  return applyDecorators(
    SetMetadata(IDEMPOTENT, { ...options, required: options.required ?? true }),
    UseInterceptors(IdempotencyInterceptor),
  );
}
