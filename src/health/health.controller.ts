import { Controller, Get } from '@nestjs/common';
import { ApiOkResponse, ApiOperation, ApiTags } from '@nestjs/swagger';
import { HealthCheck, HealthCheckService, TypeOrmHealthIndicator } from '@nestjs/terminus';
import { Public } from '../common/api-key.guard.js';
import { ApiProblems } from '../common/api-problem-responses.js';

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
  @ApiOperation({ summary: 'Liveness and database reachability' })
  @ApiOkResponse({ description: 'The service and its database answer.', schema: { example: { status: 'ok', info: { database: { status: 'up' } }, error: {}, details: { database: { status: 'up' } } } } })
  @ApiProblems({ status: 503, description: 'The database does not answer.' })
  check() {
    return this.health.check([() => this.db.pingCheck('database', { timeout: 1_000 })]);
  }
}
