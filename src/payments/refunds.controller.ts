import { Body, Controller, Get, HttpCode, HttpStatus, Param, Post, Req } from '@nestjs/common';
import { ApiBearerAuth, ApiCreatedResponse, ApiOkResponse, ApiOperation, ApiTags } from '@nestjs/swagger';
import type { FastifyRequest as Request } from 'fastify';
import { UNAUTHORIZED, TOO_MANY_FAILED_AUTHENTICATIONS } from '../common/api-problems.js';
import {
  PAYMENT_NOT_FOUND,
  PROVIDER_UNAVAILABLE,
  REFUND_DECLINED,
  REFUND_EXCEEDS_PAYMENT,
  REFUND_NOT_ALLOWED,
  REFUND_NOT_FOUND,
  REFUND_PENDING,
} from './payment-api-docs.js';
import { ClientId } from '../common/client-id.decorator.js';
import { AtomicPhases } from '@idempotent-orders/idempotency';
import { type KeyAnswer, PhasedIdempotentEndpoint } from '../common/idempotent-endpoint.js';

import { RefundPaymentDto } from './dto/refund-payment.dto.js';
import { RefundList, RefundView } from './dto/refund.view.js';
import { RefundsService } from './refunds.service.js';
import { ApiProblems, UNSUPPORTED_MEDIA_TYPE, VALIDATION_FAILED } from '#service-kit';

@ApiTags('payments')
@ApiBearerAuth()
@ApiProblems(UNAUTHORIZED, TOO_MANY_FAILED_AUTHENTICATIONS)
@Controller()
export class RefundsController {
  constructor(
    private readonly refunds: RefundsService,
    private readonly phases: AtomicPhases,
  ) {}

  @Post('payments/:id/refunds')
  @HttpCode(HttpStatus.CREATED)
  @PhasedIdempotentEndpoint()
  @ApiOperation({
    summary: 'Refund a payment, fully or partly',
    description:
      'Only a succeeded payment of a cancelled order. The amount (default: what remains) is reserved by one conditional UPDATE before the ' +
      'provider is called, so parallel refunds never exceed the payment. When the settled refunds reach the amount, the order becomes refunded.',
  })
  @ApiCreatedResponse({
    type: RefundView,
    description: 'Refunded.',
    headers: { Location: { description: '/refunds/{id}', schema: { type: 'string' } } },
  })
  @ApiProblems(
    VALIDATION_FAILED,
    REFUND_DECLINED,
    PAYMENT_NOT_FOUND,
    REFUND_NOT_ALLOWED,
    REFUND_EXCEEDS_PAYMENT,
    PROVIDER_UNAVAILABLE,
    REFUND_PENDING,
    UNSUPPORTED_MEDIA_TYPE,
  )
  refundPayment(@Req() req: Request, @Param('id') paymentId: string, @Body() dto: RefundPaymentDto): Promise<KeyAnswer> {
    // The key's scope after the body is validated (an invalid body is a 400 and claims nothing); the phases are the service's.
    return this.refunds.refundPayment(this.phases.scopeOf(req), paymentId, dto.amountMinor);
  }

  @Get('payments/:id/refunds')
  @ApiOperation({
    summary: "A payment's refunds, oldest first",
    description: 'Every refund asked for, pending, succeeded or failed; the failed ones reserve nothing.',
  })
  @ApiOkResponse({ type: RefundList })
  @ApiProblems(PAYMENT_NOT_FOUND)
  async listPaymentRefunds(@ClientId() clientId: string, @Param('id') paymentId: string): Promise<RefundList> {
    return { items: await this.refunds.listPaymentRefunds(clientId, paymentId) };
  }

  @Get('refunds/:id')
  @ApiOperation({
    summary: 'Read a refund',
    description:
      'A pending refund is still being decided with the provider; it settles on a retry of its key, through the reconciler or a webhook.',
  })
  @ApiOkResponse({ type: RefundView })
  @ApiProblems(REFUND_NOT_FOUND)
  findRefund(@ClientId() clientId: string, @Param('id') id: string): Promise<RefundView> {
    return this.refunds.findRefund(clientId, id);
  }
}
