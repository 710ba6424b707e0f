import { Controller, Get } from '@nestjs/common';
import { ApiOkResponse, ApiOperation, ApiTags } from '@nestjs/swagger';
import { HealthCheck, HealthCheckService, TypeOrmHealthIndicator } from '@nestjs/terminus';
import { Public } from '../common/api-key.guard.js';
import { ApiProblems, UNSUPPORTED_MEDIA_TYPE } from '../common/api-problem-responses.js';

@ApiTags('operations')
@Public()
@Controller('health')
export class HealthController {
  constructor(
    private readonly health: HealthCheckService,
    private readonly db: TypeOrmHealthIndicator,
  ) {}

  @Get()
  @HealthCheck({ swaggerDocumentation: false })
  @ApiOperation({
    operationId: 'checkHealth',
    summary: 'Liveness and database reachability',
    description: 'For load balancers and orchestrators: 200 while the service answers and its database answers a ping within 1 s, else 503. Needs no API key.',
    // Public (no API key): overrides the document's default bearer requirement.
    security: [],
  })
  @ApiOkResponse({ description: 'The service and its database answer.', schema: { example: { status: 'ok', info: { database: { status: 'up' } }, error: {}, details: { database: { status: 'up' } } } } })
  @ApiProblems(UNSUPPORTED_MEDIA_TYPE, {
    status: 503,
    description: 'The database does not answer.',
    example: { type: 'about:blank', title: 'Service Unavailable', status: 503 },
  })
  check() {
    return this.health.check([() => this.db.pingCheck('database', { timeout: 1_000 })]);
  }
}
