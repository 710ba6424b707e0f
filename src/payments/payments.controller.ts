import { Body, Controller, Get, HttpCode, HttpStatus, Param, Post, Req, Res } from '@nestjs/common';
import { ApiBearerAuth, ApiCreatedResponse, ApiOkResponse, ApiOperation, ApiTags } from '@nestjs/swagger';
import type { Request, Response } from 'express';
import { ApiProblems, ORDER_NOT_FOUND, UNAUTHORIZED, VALIDATION_FAILED } from '../common/api-problem-responses.js';
import { ClientId } from '../common/client-id.decorator.js';
import { AtomicPhases } from '../idempotency/atomic-phases.js';
import { writeStoredResponse } from '../idempotency/stored-response.js';
import { ApiPhasedIdempotencyKey } from './api-payment-docs.js';
import { PayOrderDto } from './dto/pay-order.dto.js';
import { PaymentList, PaymentView } from './dto/payment.view.js';
import { PaymentsService } from './payments.service.js';

const PAYMENT_NOT_FOUND = {
  status: 404,
  description: 'No such payment for this client.',
  example: { type: 'urn:idempotent-orders:problem:payment-not-found', title: 'Payment not found', status: 404, detail: 'There is no payment 9b2e….' },
};

@ApiTags('payments')
@ApiBearerAuth()
@ApiProblems(UNAUTHORIZED)
@Controller()
export class PaymentsController {
  constructor(
    private readonly payments: PaymentsService,
    private readonly phases: AtomicPhases,
  ) {}

  @Post('orders/:id/payments')
  @HttpCode(HttpStatus.CREATED)
  @ApiPhasedIdempotencyKey()
  @ApiOperation({
    summary: 'Pay an order through the provider',
    description:
      'Charges the order total. Atomic phases under the Idempotency-Key: the pending payment and its outbound key are committed before the ' +
      'provider is called; the outcome and the answer are committed together after. A decline (402) is final and stored; a new key may pay ' +
      'again. An unknown outcome (503 payment-pending) is not: retry with the same key.',
  })
  @ApiCreatedResponse({ type: PaymentView, description: 'Paid: the order is now paid.', headers: { Location: { description: '/payments/{id}', schema: { type: 'string' } } } })
  @ApiProblems(
    VALIDATION_FAILED,
    {
      status: 402,
      description: 'The provider declined the charge (failureCode card_declined), refused the source (invalid_source), or was never reached (provider_unreachable). Stored under the key.',
      example: { type: 'urn:idempotent-orders:problem:payment-declined', title: 'Payment declined', status: 402, detail: 'Payment 9b2e… failed: card_declined.', paymentId: '9b2e…', failureCode: 'card_declined' },
    },
    ORDER_NOT_FOUND,
    {
      status: 409,
      description:
        'order-not-payable (the order is not created; stored), nothing-to-pay (total 0; stored), or payment-in-progress (another key is paying this order; not stored, Retry-After).',
      headers: { 'Retry-After': { description: 'seconds (payment-in-progress)', schema: { type: 'string' } } },
      example: { type: 'urn:idempotent-orders:problem:order-not-payable', title: 'Order cannot be paid', status: 409, detail: 'Order 6f1c… is paid: only a created order can be paid.', orderId: '6f1c…', currentStatus: 'paid' },
    },
    {
      status: 503,
      description:
        'provider-unavailable (the provider is failing; nothing written) or payment-pending (outcome unknown; the payment stays pending — retry with the same key). Not stored.',
      headers: { 'Retry-After': { description: 'seconds', schema: { type: 'string' } } },
      example: { type: 'urn:idempotent-orders:problem:payment-pending', title: 'Payment outcome not known yet', status: 503, detail: 'The provider has not confirmed payment 9b2e… yet.', paymentId: '9b2e…' },
    },
  )
  async payOrder(@Req() req: Request, @Param('id') orderId: string, @Body() dto: PayOrderDto, @Res({ passthrough: true }) res: Response): Promise<string> {
    const { response, replayed } = await this.payments.payOrder(this.phases.scopeOf(req), orderId, dto.source);
    return writeStoredResponse(res, response, replayed);
  }

  @Get('orders/:id/payments')
  @ApiOperation({ summary: "An order's payments, oldest first", description: 'Failed payments stay listed; at most one is pending or succeeded.' })
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
