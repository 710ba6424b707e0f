import { ApiProperty, ApiPropertyOptional } from '@nestjs/swagger';

/** The body the provider sends, for the OpenAPI document only: the consumer verifies the raw bytes before it reads them. */
export class PspWebhookEventData {
  @ApiProperty({ example: 'ch_3f9a1c' })
  chargeId: string;
  @ApiPropertyOptional({ description: 'Refund events only', example: 're_7b21d0' })
  providerRefundId?: string;
  @ApiPropertyOptional({ description: 'Refund events only: our refund id, from the metadata we sent', format: 'uuid' })
  refundId?: string;
  @ApiProperty({ description: 'Our payment id, from the metadata we sent', format: 'uuid' })
  paymentId: string;
  @ApiProperty({ format: 'uuid' })
  orderId: string;
  @ApiPropertyOptional({
    description:
      "Charge events: the deployment that made the charge, from the metadata we sent. A charge for a payment we do not have is refunded only when it is this deployment's.",
  })
  deploymentId?: string;
  @ApiProperty({ example: 2500, minimum: 1 })
  amountMinor: number;
  @ApiProperty({ example: 'EUR', pattern: '^[A-Z]{3}$' })
  currency: string;
  @ApiProperty({ enum: ['succeeded', 'failed'] })
  status: string;
  @ApiPropertyOptional({ example: 'card_declined', nullable: true, type: String })
  failureCode?: string | null;
}

export class PspWebhookEvent {
  @ApiProperty({
    enum: ['charge.succeeded', 'charge.failed', 'refund.succeeded', 'refund.failed'],
    description: 'Other types are acknowledged and ignored.',
  })
  type: string;
  @ApiProperty({ format: 'date-time' })
  timestamp: string;
  @ApiProperty({ type: PspWebhookEventData })
  data: PspWebhookEventData;
}

export class WebhookReceiptView {
  @ApiProperty({ example: 'msg_2b7c9e' })
  webhookId: string;
  @ApiProperty({
    enum: ['applied', 'no_effect', 'duplicate'],
    description:
      'applied: the event settled something; no_effect: recorded, nothing to change (see detail); duplicate: processed before, nothing done again.',
  })
  outcome: string;
  @ApiProperty({
    example: 'payment-succeeded',
    description:
      "What it did (payment-succeeded, unknown-payment: refund requested, …), or why it did nothing (unknown-payment, unknown-payment: not this deployment's charge …, already-settled: …, mismatch: …, unknown-type, malformed: …).",
  })
  detail: string;
}
