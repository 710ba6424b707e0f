import { Body, Controller, Get, HttpCode, HttpStatus, Param, Post, Req } from '@nestjs/common';
import { ApiBearerAuth, ApiCreatedResponse, ApiOkResponse, ApiOperation, ApiTags } from '@nestjs/swagger';
import type { FastifyRequest as Request } from 'fastify';
import { ORDER_NOT_FOUND, UNAUTHORIZED, TOO_MANY_FAILED_AUTHENTICATIONS } from '../common/api-problems.js';
import {
  NOTHING_TO_PAY,
  ORDER_NOT_PAYABLE,
  PAYMENT_DECLINED,
  PAYMENT_IN_PROGRESS,
  PAYMENT_NOT_FOUND,
  PAYMENT_PENDING,
  PROVIDER_UNAVAILABLE,
} from './payment-api-docs.js';
import { ClientId } from '../common/client-id.decorator.js';
import { AtomicPhases } from '@idempotent-orders/idempotency';
import { type KeyAnswer, PhasedIdempotentEndpoint } from '../common/idempotent-endpoint.js';

import { PayOrderDto } from './dto/pay-order.dto.js';
import { PaymentList, PaymentView } from './dto/payment.view.js';
import { PaymentsService } from './payments.service.js';
import { ApiProblems, UNSUPPORTED_MEDIA_TYPE, VALIDATION_FAILED } from '#service-kit';

@ApiTags('payments')
@ApiBearerAuth()
@ApiProblems(UNAUTHORIZED, TOO_MANY_FAILED_AUTHENTICATIONS)
@Controller()
export class PaymentsController {
  constructor(
    private readonly payments: PaymentsService,
    private readonly phases: AtomicPhases,
  ) {}

  @Post('orders/:id/payments')
  @HttpCode(HttpStatus.CREATED)
  @PhasedIdempotentEndpoint()
  @ApiOperation({
    summary: 'Pay an order through the provider',
    description:
      'Charges the order total. Atomic phases under the Idempotency-Key: the pending payment and its outbound key are committed before the ' +
      'provider is called; the outcome and the answer are committed together after. A decline (402) is final and stored; a new key may pay ' +
      'again. An unknown outcome (503 payment-pending) is not: retry with the same key.',
  })
  @ApiCreatedResponse({
    type: PaymentView,
    description: 'Paid: the order is now paid.',
    headers: { Location: { description: '/payments/{id}', schema: { type: 'string' } } },
  })
  @ApiProblems(
    VALIDATION_FAILED,
    PAYMENT_DECLINED,
    ORDER_NOT_FOUND,
    ORDER_NOT_PAYABLE,
    NOTHING_TO_PAY,
    PAYMENT_IN_PROGRESS,
    PROVIDER_UNAVAILABLE,
    PAYMENT_PENDING,
    UNSUPPORTED_MEDIA_TYPE,
  )
  payOrder(@Req() req: Request, @Param('id') orderId: string, @Body() dto: PayOrderDto): Promise<KeyAnswer> {
    // The key's scope after the body is validated (an invalid body is a 400 and claims nothing); the phases are the service's.
    return this.payments.payOrder(this.phases.scopeOf(req), orderId, dto.source);
  }

  @Get('orders/:id/payments')
  @ApiOperation({
    summary: "An order's payments, oldest first",
    description: 'Failed payments stay listed; at most one is pending or succeeded.',
  })
  @ApiOkResponse({ type: PaymentList })
  @ApiProblems(ORDER_NOT_FOUND)
  async listOrderPayments(@ClientId() clientId: string, @Param('id') orderId: string): Promise<PaymentList> {
    return { items: await this.payments.listOrderPayments(clientId, orderId) };
  }

  @Get('payments/:id')
  @ApiOperation({ summary: 'Read a payment', description: 'refundedMinor counts refunds reserved or settled.' })
  @ApiOkResponse({ type: PaymentView })
  @ApiProblems(PAYMENT_NOT_FOUND)
  findPayment(@ClientId() clientId: string, @Param('id') id: string): Promise<PaymentView> {
    return this.payments.findPayment(clientId, id);
  }
}
