import { Logger, type LoggerService } from '@nestjs/common';
import { IdempotencyMetrics } from './idempotency-metrics.js';

describe('IdempotencyMetrics.note', () => {
  it("writes a refusal's line at Nest's log level and a success's at debug, and hands the logger nothing when that level is off", async () => {
    const lines: unknown[] = [];
    const capture: LoggerService = {
      log: (message: unknown) => lines.push(`log ${String(message)}`),
      debug: (message: unknown) => lines.push(`debug ${String(message)}`),
      error: () => undefined,
      warn: () => undefined,
    };
    Logger.overrideLogger(capture);
    const metrics = await IdempotencyMetrics.create(false);

    Logger.overrideLogger(['fatal', 'error', 'warn', 'log', 'debug']);
    metrics.note('executed', 'ada', 'k1');
    metrics.note('mismatch', 'ada', 'k1');
    expect(lines).toEqual(['debug idempotency executed: client ada, key k1', 'log idempotency mismatch: client ada, key k1']);

    // LOG_LEVEL=info (http-app.ts sets Nest's levels from it): a success's line is not even built, a refusal's is written.
    Logger.overrideLogger(['fatal', 'error', 'warn', 'log']);
    metrics.note('replayed', 'ada', 'k1');
    metrics.note('conflict', 'ada', 'k1');
    expect(lines.slice(2)).toEqual(['log idempotency conflict: client ada, key k1']);

    // LOG_LEVEL=warn: neither.
    Logger.overrideLogger(['fatal', 'error', 'warn']);
    metrics.note('missing', 'ada', undefined);
    expect(lines).toHaveLength(3);
  });
});
