import { Logger, type LoggerService } from '@nestjs/common';
import { IdempotencyMetrics } from './idempotency-metrics.js';

describe('IdempotencyMetrics.note', () => {
  it("writes each outcome's line at Nest's log level, and hands the logger nothing when that level is off", async () => {
    const lines: unknown[] = [];
    const capture: LoggerService = { log: (message: unknown) => lines.push(message), error: () => undefined, warn: () => undefined };
    Logger.overrideLogger(capture);
    const metrics = await IdempotencyMetrics.create(false);

    Logger.overrideLogger(['fatal', 'error', 'warn', 'log']);
    metrics.note('executed', 'ada', 'k1');
    expect(lines).toEqual(['idempotency executed: client ada, key k1']);

    // LOG_LEVEL=warn (http-app.ts sets Nest's levels from it): the line is not even built.
    Logger.overrideLogger(['fatal', 'error', 'warn']);
    metrics.note('replayed', 'ada', 'k1');
    expect(lines).toHaveLength(1);
  });
});
