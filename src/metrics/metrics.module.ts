import { Controller, Get, Global, Header, Module } from '@nestjs/common';
import { ApiOkResponse, ApiOperation, ApiProduces, ApiTags } from '@nestjs/swagger';
import { collectDefaultMetrics, Histogram, Registry } from 'prom-client';
import { ApiProblems, Public, UNSUPPORTED_MEDIA_TYPE } from '#service-kit';

/** One registry per app instance (not prom-client's global), so several apps in one test process don't collide. */
export function createRegistry(): Registry {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  return registry;
}

export const HTTP_DURATION = 'http_request_duration_seconds';

export function httpDurationHistogram(registry: Registry): Histogram<'method' | 'route' | 'status'> {
  return new Histogram({
    name: HTTP_DURATION,
    help: 'HTTP request duration by method, route pattern and status code',
    labelNames: ['method', 'route', 'status'],
    // From a replay (~1 ms) to a duplicate waiting out IDEMPOTENCY_WAIT_MS (seconds).
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    registers: [registry],
  });
}

@ApiTags('operations')
@Public()
@Controller('metrics')
export class MetricsController {
  constructor(private readonly registry: Registry) {}

  @Get()
  @Header('Content-Type', 'text/plain; version=0.0.4; charset=utf-8')
  @ApiOperation({
    operationId: 'getMetrics',
    summary: 'Prometheus metrics',
    description:
      'For a Prometheus scraper: request durations by route and status, idempotency outcomes (executed, replayed, waited, ' +
      'conflict, mismatch, missing) and process metrics. Needs no API key: keep it off the public network.',
    // Public (no API key): overrides the document's default bearer requirement.
    security: [],
  })
  @ApiProduces('text/plain')
  @ApiOkResponse({ description: 'Prometheus text exposition format.', schema: { type: 'string' } })
  @ApiProblems(UNSUPPORTED_MEDIA_TYPE)
  metrics(): Promise<string> {
    return this.registry.metrics();
  }
}

@Global()
@Module({
  controllers: [MetricsController],
  providers: [{ provide: Registry, useFactory: createRegistry }],
  exports: [Registry],
})
export class MetricsModule {}
