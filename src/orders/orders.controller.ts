import { Body, Controller, Get, HttpCode, HttpStatus, Param, Post, Query, Res } from '@nestjs/common';
import { ApiBearerAuth, ApiCreatedResponse, ApiOkResponse, ApiOperation, ApiTags } from '@nestjs/swagger';
import type { Response } from 'express';
import { ApiProblems, ORDER_NOT_FOUND, UNAUTHORIZED, VALIDATION_FAILED } from '../common/api-problem-responses.js';
import { ClientId } from '../common/client-id.decorator.js';
import { Idempotent } from '../idempotency/idempotent.decorator.js';
import { CreateOrderDto } from './dto/create-order.dto.js';
import { ListOrdersQuery } from './dto/list-orders.query.js';
import { OrderPage, OrderView } from './dto/order.view.js';
import { OrdersService } from './orders.service.js';

const ETAG_HEADER = { ETag: { description: 'The order version, for If-Match: "<version>"', schema: { type: 'string' } } };

/** A weak-comparison-safe strong ETag: the version is the whole state identity of an order. */
export const etagOf = (order: OrderView) => `"${order.version}"`;

@ApiTags('orders')
@ApiBearerAuth()
@ApiProblems(UNAUTHORIZED)
@Controller('orders')
export class OrdersController {
  constructor(private readonly orders: OrdersService) {}

  @Post()
  @HttpCode(HttpStatus.CREATED)
  @Idempotent()
  @ApiOperation({ summary: 'Create an order', description: 'The server computes totalMinor. orderNumber is the natural key per client.' })
  @ApiCreatedResponse({ type: OrderView, description: 'Created.', headers: { Location: { description: '/orders/{id}', schema: { type: 'string' } }, ...ETAG_HEADER } })
  @ApiOkResponse({ type: OrderView, description: 'An order with this orderNumber and the same content exists: it is returned, nothing is created.' })
  @ApiProblems(VALIDATION_FAILED, {
    status: 409,
    description: 'The orderNumber belongs to an order with different content.',
    example: { type: 'urn:idempotent-orders:problem:order-number-conflict', title: 'Order number already used', status: 409, detail: 'Order number PO-1 already belongs to an order with different content.', orderId: '3b7e…' },
  }, { status: 413, description: 'The body is larger than the limit.' })
  async createOrder(@ClientId() clientId: string, @Body() dto: CreateOrderDto, @Res({ passthrough: true }) res: Response): Promise<OrderView> {
    const { order, created } = await this.orders.createOrder(clientId, dto);
    res.status(created ? HttpStatus.CREATED : HttpStatus.OK).location(`/orders/${order.id}`).setHeader('ETag', etagOf(order));
    return order;
  }

  @Get()
  @ApiOperation({ summary: 'List orders, newest first (keyset pagination)' })
  @ApiOkResponse({ type: OrderPage })
  @ApiProblems({ ...VALIDATION_FAILED, description: 'Invalid limit, status or cursor.' })
  listOrders(@ClientId() clientId: string, @Query() query: ListOrdersQuery): Promise<OrderPage> {
    return this.orders.listOrders(clientId, query);
  }

  @Get(':id')
  @ApiOperation({ summary: 'Read an order' })
  @ApiOkResponse({ type: OrderView, headers: ETAG_HEADER })
  @ApiProblems(ORDER_NOT_FOUND)
  async getOrder(@ClientId() clientId: string, @Param('id') id: string, @Res({ passthrough: true }) res: Response): Promise<OrderView> {
    const order = await this.orders.findOrder(clientId, id);
    res.setHeader('ETag', etagOf(order));
    return order;
  }
}
