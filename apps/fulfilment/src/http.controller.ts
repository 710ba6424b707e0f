import { Controller, Get, Header, HttpCode, Inject, NotFoundException, Param, ParseUUIDPipe, UseGuards } from '@nestjs/common';
import { Database, ProblemDetailsException } from '@idempotent-orders/idempotency';
import type { Registry } from 'prom-client';
import { Public } from '#service-kit';
import { ApiTokenGuard } from './api-token.guard.js';
import { BrokerStatus } from './broker-status.js';
import { METRICS_REGISTRY } from './metrics.js';
import { type Shipment, ShipmentsService } from './shipments.service.js';

/**
 * Guarded here rather than app-wide: the app's global enhancers also run on the broker's message handlers
 * (connectMicroservice inherits them), which have no Authorization header. Shipments name clients and totals.
 */
@Controller()
@UseGuards(ApiTokenGuard)
export class HttpController {
  constructor(
    private readonly shipments: ShipmentsService,
    private readonly db: Database,
    private readonly broker: BrokerStatus,
    @Inject(METRICS_REGISTRY) private readonly registry: Registry,
  ) {}

  /** The shipment the order's events made (404 until its first event with an effect is applied). */
  @Get('shipments/:orderId')
  async shipment(@Param('orderId', new ParseUUIDPipe()) orderId: string): Promise<Shipment> {
    const shipment = await this.shipments.find(orderId);
    if (!shipment) throw new NotFoundException(`no shipment for order ${orderId}`);
    return shipment;
  }

  /**
   * 200 when the database answers and this process consumes its queue (its connection up, its consumer held); 503
   * (problem+json) otherwise.
   * Hand-written, not @nestjs/terminus: two checks, one of them the transport's own status, which terminus has no indicator for.
   */
  @Get('health')
  @Public()
  @HttpCode(200)
  async health(): Promise<{ status: 'ok'; database: 'up'; broker: string; consumer: 'consuming' }> {
    const database = await this.db.query('SELECT 1').then(
      () => 'up',
      () => 'down',
    );
    const broker = this.broker.current;
    const consumer = this.broker.consuming ? 'consuming' : 'not consuming';
    if (database !== 'up' || broker !== 'connected' || consumer !== 'consuming') {
      // A problem of our own: the filter hides a plain 5xx's message, and an operator needs to see which one is away.
      const detail = `database ${database}, broker ${broker}, ${consumer}`;
      throw new ProblemDetailsException({
        type: 'about:blank',
        title: 'Service Unavailable',
        status: 503,
        detail,
        database,
        broker,
        consumer,
      });
    }
    return { status: 'ok', database: 'up', broker, consumer };
  }

  @Get('metrics')
  @Header('Content-Type', 'text/plain; version=0.0.4')
  metrics(): Promise<string> {
    return this.registry.metrics();
  }
}
