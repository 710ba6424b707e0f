import { Controller, HttpCode, HttpStatus, Post, Req } from '@nestjs/common';
import { ApiBody, ApiConsumes, ApiHeader, ApiOkResponse, ApiOperation, ApiTags } from '@nestjs/swagger';
import type { FastifyRequest } from 'fastify';
import { PspWebhookEvent, WebhookReceiptView } from './dto/psp-webhook-event.doc.js';
import { WebhooksService } from './webhooks.service.js';
import { ApiProblems, KeepRawBody, Public } from '#service-kit';

@ApiTags('webhooks')
// No API key: the provider authenticates each delivery with its signature.
@Public()
@Controller('webhooks')
export class WebhooksController {
  constructor(private readonly webhooks: WebhooksService) {}

  @Post('psp')
  @KeepRawBody()
  @HttpCode(HttpStatus.OK)
  @ApiOperation({
    summary: "Receive the payment provider's events",
    description:
      'Standard Webhooks: the signature (HMAC-SHA256 with PSP_WEBHOOK_SECRET over `webhook-id.webhook-timestamp.body`, the exact bytes sent) must match and ' +
      'the timestamp be within 5 minutes. Each event is processed once: its webhook-id is recorded in the same transaction as its effect, so a ' +
      'redelivery (later or concurrent) answers 200 `duplicate` and changes nothing. Events never move a payment, refund or order backwards; an ' +
      'event for an unknown or already-settled payment, of an unknown type, or whose amount or currency differs from ours is recorded with no effect. ' +
      'A charge.succeeded for a payment we failed is refunded automatically.',
    // No API key: the signature authenticates the delivery.
    security: [],
  })
  @ApiHeader({
    name: 'webhook-id',
    required: true,
    description: 'The event id: the same on every delivery of one event.',
    schema: { type: 'string', maxLength: 255, example: 'msg_2b7c9e' },
  })
  @ApiHeader({
    name: 'webhook-timestamp',
    required: true,
    description: 'Unix seconds when this delivery was signed; refused when more than 5 minutes away from now.',
    schema: { type: 'string', example: '1764475200' },
  })
  @ApiHeader({
    name: 'webhook-signature',
    required: true,
    description: 'Space-separated `v1,<base64 signature>` entries; any one that matches passes (secret rotation).',
    schema: { type: 'string', example: 'v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=' },
  })
  @ApiConsumes('application/json')
  @ApiBody({ type: PspWebhookEvent })
  @ApiOkResponse({
    type: WebhookReceiptView,
    description: 'Processed now (applied or no_effect) or before (duplicate). The provider stops delivering it.',
  })
  @ApiProblems(
    {
      status: 400,
      description: 'A correctly signed delivery whose webhook-id is longer than 255 characters. Nothing recorded.',
      example: {
        type: 'urn:idempotent-orders:problem:webhook-id-invalid',
        title: 'webhook-id not accepted',
        status: 400,
        detail: 'webhook-id must be 1 to 255 characters: nothing was recorded.',
      },
    },
    {
      status: 401,
      description: 'Signature headers missing, no matching signature, or a timestamp more than 5 minutes old or ahead. Nothing recorded.',
      example: {
        type: 'urn:idempotent-orders:problem:webhook-signature-invalid',
        title: 'Webhook signature not valid',
        status: 401,
        detail: 'No matching signature found: nothing was recorded.',
      },
    },
    {
      status: 503,
      description: 'The event could not be processed (a database error); nothing was recorded, so a redelivery applies it once.',
      headers: { 'Retry-After': { description: 'seconds', schema: { type: 'string' } } },
      example: {
        type: 'urn:idempotent-orders:problem:webhook-not-processed',
        title: 'Webhook not processed',
        status: 503,
        detail: 'The event could not be processed right now and nothing was recorded: deliver it again.',
        webhookId: 'msg_2b7c9e',
      },
      members: { webhookId: { type: 'string', description: 'The webhook-id of the event that was not processed.' } },
    },
  )
  receive(@Req() req: FastifyRequest): Promise<WebhookReceiptView> {
    // The exact bytes (@KeepRawBody); no body at all is an empty one.
    const raw = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
    return this.webhooks.receive(raw, req.headers);
  }
}
