import { Body, Controller, Get, HttpCode, HttpStatus, Param, Post, Req, Res } from '@nestjs/common';
import { ApiBearerAuth, ApiCreatedResponse, ApiOkResponse, ApiOperation, ApiTags } from '@nestjs/swagger';
import type { Request, Response } from 'express';
import { ApiProblems, UNAUTHORIZED, VALIDATION_FAILED } from '../common/api-problem-responses.js';
import { ClientId } from '../common/client-id.decorator.js';
import { AtomicPhases } from '../idempotency/atomic-phases.js';
import { writeStoredResponse } from '../idempotency/stored-response.js';
import { ApiPhasedIdempotencyKey } from './api-payment-docs.js';
import { RefundPaymentDto } from './dto/refund-payment.dto.js';
import { RefundList, RefundView } from './dto/refund.view.js';
import { RefundsService } from './refunds.service.js';

const PAYMENT_NOT_FOUND = {
  status: 404,
  description: 'No such payment for this client.',
  example: { type: 'urn:idempotent-orders:problem:payment-not-found', title: 'Payment not found', status: 404, detail: 'There is no payment 9b2e….' },
};

@ApiTags('payments')
@ApiBearerAuth()
@ApiProblems(UNAUTHORIZED)
@Controller()
export class RefundsController {
  constructor(
    private readonly refunds: RefundsService,
    private readonly phases: AtomicPhases,
  ) {}

  @Post('payments/:id/refunds')
  @HttpCode(HttpStatus.CREATED)
  @ApiPhasedIdempotencyKey()
  @ApiOperation({
    summary: 'Refund a payment, fully or partly',
    description:
      'Only a succeeded payment of a cancelled order. The amount (default: what remains) is reserved by one conditional UPDATE before the ' +
      'provider is called, so parallel refunds never exceed the payment. When the settled refunds reach the amount, the order becomes refunded.',
  })
  @ApiCreatedResponse({ type: RefundView, description: 'Refunded.', headers: { Location: { description: '/refunds/{id}', schema: { type: 'string' } } } })
  @ApiProblems(
    VALIDATION_FAILED,
    {
      status: 402,
      description: 'The provider declined the refund; its reservation is given back. Stored under the key.',
      example: { type: 'urn:idempotent-orders:problem:refund-declined', title: 'Refund declined', status: 402, detail: 'Refund 1d4a… failed: refund_declined.', refundId: '1d4a…', paymentId: '9b2e…', failureCode: 'refund_declined' },
    },
    PAYMENT_NOT_FOUND,
    {
      status: 409,
      description: 'The payment is not succeeded, or its order is not cancelled. Stored.',
      example: { type: 'urn:idempotent-orders:problem:refund-not-allowed', title: 'Refund not allowed', status: 409, detail: 'Payment 9b2e… is succeeded and its order is paid: only a succeeded payment of a cancelled order can be refunded.', paymentId: '9b2e…', paymentStatus: 'succeeded', orderStatus: 'paid' },
    },
    {
      status: 422,
      description: 'More than remains refundable. Stored.',
      example: { type: 'urn:idempotent-orders:problem:refund-exceeds-payment', title: 'Refund exceeds the payment', status: 422, detail: 'Payment 9b2e… has 500 minor units left to refund; 800 were asked for.', paymentId: '9b2e…', requestedMinor: 800, refundableMinor: 500 },
    },
    {
      status: 503,
      description: 'provider-unavailable (nothing written) or refund-pending (outcome unknown; retry with the same key). Not stored.',
      headers: { 'Retry-After': { description: 'seconds', schema: { type: 'string' } } },
      example: { type: 'urn:idempotent-orders:problem:refund-pending', title: 'Refund outcome not known yet', status: 503, detail: 'The provider has not confirmed refund 1d4a… yet.', refundId: '1d4a…' },
    },
  )
  async refundPayment(@Req() req: Request, @Param('id') paymentId: string, @Body() dto: RefundPaymentDto, @Res({ passthrough: true }) res: Response): Promise<string> {
    const { response, replayed } = await this.refunds.refundPayment(this.phases.scopeOf(req), paymentId, dto.amountMinor);
    return writeStoredResponse(res, response, replayed);
  }

  @Get('payments/:id/refunds')
  @ApiOperation({ summary: "A payment's refunds, oldest first" })
  @ApiOkResponse({ type: RefundList })
  @ApiProblems(PAYMENT_NOT_FOUND)
  async listPaymentRefunds(@ClientId() clientId: string, @Param('id') paymentId: string): Promise<RefundList> {
    return { items: await this.refunds.listPaymentRefunds(clientId, paymentId) };
  }

  @Get('refunds/:id')
  @ApiOperation({ summary: 'Read a refund' })
  @ApiOkResponse({ type: RefundView })
  @ApiProblems({
    status: 404,
    description: 'No such refund for this client.',
    example: { type: 'urn:idempotent-orders:problem:refund-not-found', title: 'Refund not found', status: 404, detail: 'There is no refund 1d4a….' },
  })
  findRefund(@ClientId() clientId: string, @Param('id') id: string): Promise<RefundView> {
    return this.refunds.findRefund(clientId, id);
  }
}
