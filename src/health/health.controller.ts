import { Controller, Get, ServiceUnavailableException } from '@nestjs/common';
import { ApiOkResponse, ApiOperation, ApiTags, type SchemaObject } from '@nestjs/swagger';
import { HealthCheck, type HealthCheckResult, HealthCheckService, TypeOrmHealthIndicator } from '@nestjs/terminus';
import { type CommitDurability, CommitDurabilityCheck } from '../database/database.module.js';
import { OrderEventsRelay, type RelayState } from '../events/order-events-relay.js';
import { ApiProblems, ProblemException, Public, UNSUPPORTED_MEDIA_TYPE } from '#service-kit';

/** A probe that waits longer than this calls the database down: a health check must answer fast, even during an outage. */
const PING_TIMEOUT_MS = 1_000;
/** Seconds a load balancer or a client should wait before asking again: a database restart takes seconds. */
const DOWN_RETRY_AFTER_SECONDS = 5;

type Indicators = Record<string, { status: string }>;

const HEALTH_INDICATORS: SchemaObject = {
  type: 'object',
  description: 'Per check (database), its status: up or down.',
  additionalProperties: { type: 'object', required: ['status'], properties: { status: { type: 'string', enum: ['up', 'down'] } } },
};

const ORDER_EVENTS_RELAY: SchemaObject = {
  type: 'string',
  enum: ['off', 'connected', 'disconnected'],
  description:
    'Whether order events are being published to RabbitMQ: off (AMQP_URL unset), connected, or disconnected (they wait in the outbox).',
};

/** Each check's status only: the driver's message (host, port, error text) is not for an unauthenticated endpoint. */
const statusOnly = (indicators: HealthCheckResult['info']): Indicators =>
  Object.fromEntries(Object.entries(indicators ?? {}).map(([name, result]) => [name, { status: result?.status ?? 'down' }]));

@ApiTags('operations')
@Public()
@Controller('health')
export class HealthController {
  constructor(
    private readonly health: HealthCheckService,
    private readonly db: TypeOrmHealthIndicator,
    private readonly relay: OrderEventsRelay,
    private readonly commits: CommitDurabilityCheck,
  ) {}

  @Get()
  @HealthCheck({ swaggerDocumentation: false })
  @ApiOperation({
    operationId: 'checkHealth',
    summary: 'Liveness and database reachability',
    description:
      'For load balancers and orchestrators: 200 while the service answers and its database answers a ping within 1 s, else 503. Needs no API key.',
    // Public (no API key): overrides the document's default bearer requirement.
    security: [],
  })
  @ApiOkResponse({
    description:
      'The service and its database answer. `orderEventsRelay` says whether order events are being published to RabbitMQ: ' +
      '`off` (AMQP_URL unset: they wait in the outbox), `connected`, or `disconnected` (they wait until the broker is back). ' +
      'It never makes the answer a 503: the API works without the broker. `databaseCommits` says whether a commit is ' +
      'acknowledged once a synchronous standby has it (`synchronous-standby`) or the primary alone (`primary-only`).',
    schema: {
      example: {
        status: 'ok',
        info: { database: { status: 'up' } },
        error: {},
        details: { database: { status: 'up' } },
        orderEventsRelay: 'connected',
        databaseCommits: 'synchronous-standby',
      },
    },
  })
  @ApiProblems(UNSUPPORTED_MEDIA_TYPE, {
    status: 503,
    description:
      'The database does not answer. The problem carries the same `info`, `error` and `details` members as a 200, naming what is down.',
    headers: { 'Retry-After': { description: 'seconds', schema: { type: 'string' } } },
    example: {
      type: 'urn:idempotent-orders:problem:unhealthy',
      title: 'Service unhealthy',
      status: 503,
      detail: 'Down: database.',
      info: {},
      error: { database: { status: 'down' } },
      details: { database: { status: 'down' } },
      orderEventsRelay: 'connected',
    },
    members: {
      info: HEALTH_INDICATORS,
      error: HEALTH_INDICATORS,
      details: HEALTH_INDICATORS,
      orderEventsRelay: ORDER_EVENTS_RELAY,
    },
  })
  async check(): Promise<HealthCheckResult & { orderEventsRelay: RelayState; databaseCommits: CommitDurability }> {
    // Said, never a check: with the broker away the API still works (the outbox holds the events), so the relay's
    // state must not take the instance out of a load balancer.
    const orderEventsRelay = this.relay.state;
    try {
      const result = await this.health.check([() => this.db.pingCheck('database', { timeout: PING_TIMEOUT_MS })]);
      // Said too, not a check: a primary that lost its synchronous standby still serves (Patroni's non-strict mode).
      return { ...result, orderEventsRelay, databaseCommits: await this.commits.current() };
    } catch (err) {
      // Terminus throws its result in a 503; the one filter writes problem+json, so it would lose which check is down.
      if (!(err instanceof ServiceUnavailableException)) throw err;
      const { info, error, details } = err.getResponse() as HealthCheckResult;
      throw ProblemException.of(
        503,
        'unhealthy',
        'Service unhealthy',
        `Down: ${Object.keys(error ?? {}).join(', ') || 'unknown'}.`,
        { info: statusOnly(info), error: statusOnly(error), details: statusOnly(details), orderEventsRelay },
        { 'Retry-After': String(DOWN_RETRY_AFTER_SECONDS) },
      );
    }
  }
}
