import {
  applyDecorators,
  Body,
  type CanActivate,
  Controller,
  type ExecutionContext,
  Get,
  Headers,
  HttpCode,
  HttpStatus,
  Injectable,
  Param,
  Patch,
  Post,
  Query,
  Res,
  UseGuards,
  UseInterceptors,
} from '@nestjs/common';
import { SettleStalePaymentsFirst } from './stale-payments.js';
import { ApiBearerAuth, ApiCreatedResponse, ApiHeader, ApiOkResponse, ApiOperation, ApiTags, type SchemaObject } from '@nestjs/swagger';
import type { FastifyReply as Response, FastifyRequest as Request } from 'fastify';
import { ORDER_ID_MEMBER, ORDER_NOT_FOUND, UNAUTHORIZED, TOO_MANY_FAILED_AUTHENTICATIONS } from '../common/api-problems.js';
import { ClientId } from '../common/client-id.decorator.js';
import { holdForConformance } from '../common/conformance-hold.js';
import { IdempotencyMetrics } from '@idempotent-orders/idempotency';
import { IdempotentEndpoint } from '../common/idempotent-endpoint.js';
import { ApiSubmitToken } from '../submit-tokens/submit-token.decorator.js';
import { idempotencyKeyOrSubmitTokenMissing, submitTokenWithIdempotencyKey } from '../submit-tokens/submit-token-problems.js';
import { SubmitTokensService } from '../submit-tokens/submit-tokens.service.js';
import { PAYMENT_IN_PROGRESS } from '../common/payment-in-progress.js';
import { CreateOrderDto } from './dto/create-order.dto.js';
import { ListOrdersQuery } from './dto/list-orders.query.js';
import { OrderEventView } from './dto/order-event.view.js';
import { OrderPage, OrderView } from './dto/order.view.js';
import { UpdateOrderDto } from './dto/update-order.dto.js';
import { parseIfMatch, versionEtag } from './if-match.js';
import { allowedFrom, nextStatuses } from './order-state-machine.js';
import { ORDER_STATUSES, type OrderStatus } from './order-status.js';
import { type ClientTransition, OrdersService } from './orders.service.js';
import { ApiProblems, type ProblemExample, UNSUPPORTED_MEDIA_TYPE, VALIDATION_FAILED } from '#service-kit';

// Swagger UI renders descriptions as Markdown (HTML included): no angle brackets, or they vanish as a tag.
const ETAG_HEADER = {
  ETag: {
    description: 'The order version in quotes, e.g. "3": send it back as If-Match to change the order.',
    schema: { type: 'string', example: '"1"' },
  },
};
const RETRY_AFTER_HEADER = { 'Retry-After': { description: 'Seconds to wait before retrying', schema: { type: 'string' } } };

const ORDER_STATUS_MEMBER: SchemaObject = { type: 'string', enum: [...ORDER_STATUSES], description: 'The status the order is in now.' };
const ORDER_STATUS_LIST: SchemaObject = { type: 'array', items: { type: 'string', enum: [...ORDER_STATUSES] } };
const EXAMPLE_ORDER_ID = '6f1c2d0e-5b7a-4c3e-9f8d-2a1b0c9d8e7f';

/** A lock wait on the order timed out (toProblem's concurrent-request): nothing changed, retrying is safe. */
const CONCURRENT_REQUEST: ProblemExample = {
  status: 409,
  description: 'Another request held the order longer than the lock timeout: nothing changed; retry after Retry-After seconds.',
  headers: RETRY_AFTER_HEADER,
  example: {
    type: 'urn:idempotent-orders:problem:concurrent-request',
    title: 'A concurrent request holds this resource',
    status: 409,
    detail: 'Another request is changing this resource right now; retry shortly.',
  },
};

const IF_MATCH = {
  name: 'If-Match',
  required: true,
  description: 'The ETag of your last read of the order, e.g. "3". The change applies only if the order is still at that version.',
  schema: { type: 'string', example: '"1"' },
} as const;

/** For each move, a status it is refused from, for the 409 example. */
const REFUSED_FROM: Record<ClientTransition, OrderStatus> = { cancelled: 'shipped', shipped: 'created', delivered: 'paid' };

function invalidTransitionExample(target: ClientTransition): ProblemExample {
  const current = REFUSED_FROM[target];
  return {
    status: 409,
    description: `The order's status does not allow this move: currentStatus says where it is, allowedTransitions where it may go.`,
    headers: ETAG_HEADER,
    example: {
      type: 'urn:idempotent-orders:problem:invalid-transition',
      title: 'Transition not allowed',
      status: 409,
      detail: `Order ${EXAMPLE_ORDER_ID} is ${current}: it cannot become ${target}.`,
      currentStatus: current,
      allowedTransitions: nextStatuses(current),
    },
    members: {
      currentStatus: ORDER_STATUS_MEMBER,
      allowedTransitions: { ...ORDER_STATUS_LIST, description: 'The statuses the order may move to from here.' },
    },
  };
}

/** What every status-changing route documents; they differ only in the status they lead to. */
function ApiTransition(target: ClientTransition, summary: string) {
  return applyDecorators(
    HttpCode(HttpStatus.OK),
    ApiOperation({
      summary,
      description:
        `Allowed from ${allowedFrom(target).join(' or ')}. One conditional UPDATE moves the order and records an order event, so of ` +
        `concurrent requests exactly one moves it. Asking again once the order is ${target} returns it unchanged: 200, no new event, same ETag.`,
    }),
    ApiOkResponse({ type: OrderView, headers: ETAG_HEADER, description: `The order, now ${target}.` }),
    ApiProblems(
      ORDER_NOT_FOUND,
      invalidTransitionExample(target),
      CONCURRENT_REQUEST,
      ...(target === 'cancelled' ? [PAYMENT_IN_PROGRESS] : []),
    ),
  );
}

/**
 * A create needs exactly one of Idempotency-Key or Submit-Token. A guard, so it runs before the
 * idempotency interceptor: a handler check would be skipped when the key replays a stored response.
 * (The ApiKeyGuard, global, has run first: an unauthenticated request is a 401.)
 */
@Injectable()
export class IdempotencyKeyOrSubmitTokenGuard implements CanActivate {
  constructor(private readonly idempotencyMetrics: IdempotencyMetrics) {}

  canActivate(context: ExecutionContext): boolean {
    const { headers, clientId } = context.switchToHttp().getRequest<Request>();
    const hasKey = headers['idempotency-key'] !== undefined;
    const hasToken = headers['submit-token'] !== undefined;
    if (hasKey && hasToken) throw submitTokenWithIdempotencyKey();
    if (!hasKey && !hasToken) {
      // The interceptor's "missing" outcome: the route just accepts a second kind of key.
      this.idempotencyMetrics.note('missing', clientId, undefined);
      throw idempotencyKeyOrSubmitTokenMissing();
    }
    return true;
  }
}

@ApiTags('orders')
@ApiBearerAuth()
@ApiProblems(UNAUTHORIZED, TOO_MANY_FAILED_AUTHENTICATIONS)
@Controller('orders')
export class OrdersController {
  constructor(
    private readonly orders: OrdersService,
    private readonly submitTokens: SubmitTokensService,
  ) {}

  @Post()
  @HttpCode(HttpStatus.CREATED)
  // Either header makes the create safe to repeat; the guard requires exactly one.
  @UseGuards(IdempotencyKeyOrSubmitTokenGuard)
  // In this order, Swagger UI lists Idempotency-Key first: the header most callers send.
  @ApiSubmitToken()
  @IdempotentEndpoint({ required: false })
  @ApiOperation({
    summary: 'Create an order',
    description:
      'The server computes totalMinor. orderNumber is the natural key per client. Send exactly one of Idempotency-Key ' +
      '(retries replay the first response) or Submit-Token (from POST /submit-tokens; creates at most one order).',
  })
  @ApiCreatedResponse({
    type: OrderView,
    description: 'Created.',
    headers: { Location: { description: '/orders/{id}', schema: { type: 'string' } }, ...ETAG_HEADER },
  })
  @ApiOkResponse({
    type: OrderView,
    description:
      'An order with this orderNumber was created from the same content (later edits do not count): it is returned as it is now, nothing is created.',
  })
  @ApiProblems(
    VALIDATION_FAILED,
    {
      status: 409,
      description: 'The orderNumber belongs to an order with different content.',
      example: {
        type: 'urn:idempotent-orders:problem:order-number-conflict',
        title: 'Order number already used',
        status: 409,
        detail: 'Order number PO-1 already belongs to an order with different content.',
        orderId: '3b7e0c52-8f3e-4c1a-9a53-1f0d2b6e7a91',
      },
      members: {
        orderId: { ...ORDER_ID_MEMBER, description: 'The order that has this orderNumber (absent if it was deleted meanwhile).' },
      },
      optionalMembers: ['orderId'],
    },
    {
      status: 413,
      description: 'The body is larger than the limit (64 KiB).',
      example: { type: 'about:blank', title: 'Payload Too Large', status: 413, detail: 'request entity too large' },
    },
    UNSUPPORTED_MEDIA_TYPE,
  )
  async createOrder(
    @ClientId() clientId: string,
    @Body() dto: CreateOrderDto,
    @Headers('submit-token') submitToken: string | undefined,
    @Res({ passthrough: true }) res: Response,
  ): Promise<OrderView> {
    // Without a Submit-Token there is an Idempotency-Key (the guard): the interceptor holds the transaction this create joins.
    const { order, created } =
      submitToken === undefined
        ? await this.orders.createOrder(clientId, dto)
        : await this.submitTokens.consumeSubmitToken(clientId, submitToken, () => this.orders.createOrder(clientId, dto));
    await holdForConformance(res);
    res
      .status(created ? HttpStatus.CREATED : HttpStatus.OK)
      .header('Location', `/orders/${order.id}`)
      .header('ETag', versionEtag(order.version));
    return order;
  }

  @Get()
  @ApiOperation({
    summary: 'List orders, newest first (keyset pagination)',
    description:
      'Your orders, optionally of one status. Pages are keyset-paginated: pass nextCursor as cursor for the next page; ' +
      'nextCursor is null on the last one. Orders created meanwhile never shift a page.',
  })
  @ApiOkResponse({ type: OrderPage })
  @ApiProblems(
    { ...VALIDATION_FAILED, description: 'Invalid limit or status.' },
    {
      status: 400,
      description: 'cursor is not a nextCursor this API gave out.',
      example: {
        type: 'urn:idempotent-orders:problem:invalid-cursor',
        title: 'Invalid cursor',
        status: 400,
        detail: 'cursor must be the nextCursor of a previous page, unchanged.',
      },
    },
  )
  listOrders(@ClientId() clientId: string, @Query() query: ListOrdersQuery): Promise<OrderPage> {
    return this.orders.listOrders(clientId, query);
  }

  @Get(':id')
  @ApiOperation({
    summary: 'Read an order',
    description:
      "One of your orders. Its ETag is the version to send as If-Match with PATCH. Another client's order is a 404, as if it did not exist.",
  })
  @ApiOkResponse({ type: OrderView, headers: ETAG_HEADER })
  @ApiProblems(ORDER_NOT_FOUND)
  async getOrder(@ClientId() clientId: string, @Param('id') id: string, @Res({ passthrough: true }) res: Response): Promise<OrderView> {
    const order = await this.orders.findOrder(clientId, id);
    res.header('ETag', versionEtag(order.version));
    return order;
  }

  @Post(':id/cancel')
  @ApiTransition('cancelled', 'Cancel an order')
  // Already safe to repeat (the conditional UPDATE); a key also replays the first answer byte for byte.
  @IdempotentEndpoint({ required: false })
  // Below it, so it runs first: stale payments are settled before the key's transaction opens.
  @UseInterceptors(SettleStalePaymentsFirst)
  cancelOrder(@ClientId() clientId: string, @Param('id') id: string, @Res({ passthrough: true }) res: Response): Promise<OrderView> {
    return this.transitionOrder(clientId, id, 'cancelled', res);
  }

  @Post(':id/ship')
  @ApiTransition('shipped', 'Mark a paid order as shipped')
  @IdempotentEndpoint({ required: false })
  shipOrder(@ClientId() clientId: string, @Param('id') id: string, @Res({ passthrough: true }) res: Response): Promise<OrderView> {
    return this.transitionOrder(clientId, id, 'shipped', res);
  }

  @Post(':id/deliver')
  @ApiTransition('delivered', 'Mark a shipped order as delivered')
  @IdempotentEndpoint({ required: false })
  deliverOrder(@ClientId() clientId: string, @Param('id') id: string, @Res({ passthrough: true }) res: Response): Promise<OrderView> {
    return this.transitionOrder(clientId, id, 'delivered', res);
  }

  private async transitionOrder(clientId: string, id: string, target: ClientTransition, res: Response): Promise<OrderView> {
    const { order } = await this.orders.transitionOrder(clientId, id, target);
    res.header('ETag', versionEtag(order.version));
    return order;
  }

  @Get(':id/events')
  @ApiOperation({
    summary: "An order's status history, oldest first",
    description: 'One event per status change; repeated requests for a status the order is already in add none.',
  })
  @ApiOkResponse({ type: [OrderEventView] })
  @ApiProblems(ORDER_NOT_FOUND)
  listOrderEvents(@ClientId() clientId: string, @Param('id') id: string): Promise<OrderEventView[]> {
    return this.orders.listOrderEvents(clientId, id);
  }

  @Patch(':id')
  // A retry after a lost answer replays the 200 and its ETag instead of a 412; the If-Match is part of the request the key is bound to.
  @IdempotentEndpoint({ required: false, boundHeaders: ['If-Match'] })
  @ApiOperation({
    summary: 'Change the shipping address and/or note',
    description:
      'Optimistic locking: send If-Match with the ETag of your last read. If the order changed since (another edit or a status change), ' +
      'the answer is 412 with the current ETag and nothing is written. Allowed while the order is created or paid. note: null clears the note.',
  })
  @ApiHeader(IF_MATCH)
  @ApiOkResponse({ type: OrderView, headers: ETAG_HEADER, description: 'The changed order, with its new version.' })
  @ApiProblems(
    {
      ...VALIDATION_FAILED,
      description:
        'The body is invalid (unknown fields, neither shippingAddress nor note, bad values), or If-Match is not a list of quoted ETags.',
    },
    {
      status: 400,
      description: 'If-Match is not a list of quoted ETags.',
      example: {
        type: 'urn:idempotent-orders:problem:invalid-if-match',
        title: 'Invalid If-Match',
        status: 400,
        detail: 'If-Match must be a list of quoted ETags, e.g. If-Match: "3".',
      },
    },
    ORDER_NOT_FOUND,
    {
      status: 409,
      description: 'The order is past the point where its details may change.',
      headers: ETAG_HEADER,
      example: {
        type: 'urn:idempotent-orders:problem:order-not-editable',
        title: 'Order can no longer be changed',
        status: 409,
        detail: `Order ${EXAMPLE_ORDER_ID} is shipped: its shipping address and note can change only while it is created or paid.`,
        currentStatus: 'shipped',
        editableStatuses: ['created', 'paid'],
      },
      members: {
        currentStatus: ORDER_STATUS_MEMBER,
        editableStatuses: { ...ORDER_STATUS_LIST, description: 'The statuses in which the details may change.' },
      },
    },
    CONCURRENT_REQUEST,
    {
      status: 412,
      description:
        'If-Match names a version the order is no longer at. Nothing was changed; the ETag header has the current version: read the order again and retry.',
      headers: ETAG_HEADER,
      example: {
        type: 'urn:idempotent-orders:problem:stale-version',
        title: 'The order has changed',
        status: 412,
        detail: `Order ${EXAMPLE_ORDER_ID} is at version 4, not the one in If-Match. Read it again (GET /orders/${EXAMPLE_ORDER_ID}) and retry with its ETag.`,
        currentVersion: 4,
      },
      members: {
        currentVersion: {
          type: 'integer',
          minimum: 1,
          description: 'The version the order is at now (its ETag is that number in quotes: 3 → "3").',
        },
      },
    },
    {
      status: 428,
      description: 'If-Match is missing (or is *, which names no version).',
      example: {
        type: 'urn:idempotent-orders:problem:precondition-required',
        title: 'Precondition required',
        status: 428,
        detail: 'This update needs If-Match with the ETag of your last read of the order, e.g. If-Match: "3".',
      },
    },
    UNSUPPORTED_MEDIA_TYPE,
  )
  async updateOrderDetails(
    @ClientId() clientId: string,
    @Param('id') id: string,
    @Headers('if-match') ifMatch: string | undefined,
    @Body() dto: UpdateOrderDto,
    @Res({ passthrough: true }) res: Response,
  ): Promise<OrderView> {
    const order = await this.orders.updateOrderDetails(clientId, id, parseIfMatch(ifMatch), dto);
    res.header('ETag', versionEtag(order.version));
    return order;
  }
}
