import { Body, Controller, Get, Headers, HttpCode, Post, Query, Res, UseGuards } from '@nestjs/common';
import {
  ApiCreatedResponse,
  ApiExtraModels,
  ApiHeader,
  ApiOkResponse,
  ApiOperation,
  ApiResponse,
  ApiTags,
  getSchemaPath,
} from '@nestjs/swagger';
import type { FastifyReply as Response } from 'fastify';
import { IDEMPOTENT_REPLAYED_HEADER, parseIdempotencyKey } from '@idempotent-orders/idempotency';
import { CreateChargeDto } from './dto/create-charge.dto.js';
import { CreateRefundDto } from './dto/create-refund.dto.js';
import { FindChargesQuery, MAX_CHARGES_PAGE } from './dto/find-charges.query.js';
import { FindRefundsQuery } from './dto/find-refunds.query.js';
import { PspChargeList, PspChargeView } from './dto/psp-charge.view.js';
import { PspRefundList, PspRefundView } from './dto/psp-refund.view.js';
import { AnswerDelays } from './answer-delays.js';
import { ProviderKeyGuard } from './provider-key.guard.js';
import { invalidQuery, keyMissing, lookupNeedsFilter, PSP_PROBLEMS } from './psp-problems.js';
import { type ProviderAnswer, PspSandboxService } from './psp-sandbox.service.js';
import { DEV_PSP_API_KEY } from './sandbox-config.js';
import { ApiProblems, problemType, Public } from '#service-kit';

/** The sandbox's tag in the OpenAPI document (declare it with this description beside the others). */
export const PSP_SANDBOX_TAG = {
  name: 'psp-sandbox (dev/test only)',
  description:
    'A payment-provider stand-in, mounted in-process when PSP_BASE_URL is unset (or run alone with `npm run psp`). ' +
    "Its own schema, pool and Idempotency-Key handling, and its own secret key (PSP_API_KEY), not a client's API key. " +
    'Never expose it in production.',
};

/** The name of the provider key's security scheme in the OpenAPI document; declare it with PROVIDER_KEY_SECURITY_SCHEME. */
export const PROVIDER_KEY_SCHEME = 'providerKey';

/** The provider key's security scheme, for DocumentBuilder.addBearerAuth(…, PROVIDER_KEY_SCHEME). */
export const PROVIDER_KEY_SECURITY_SCHEME = {
  type: 'http' as const,
  scheme: 'bearer',
  bearerFormat: 'provider key',
  description:
    "The sandbox provider's secret key (PSP_API_KEY), which the service's payment client sends as a merchant does; not a client's API key. " +
    '`npm start` on the embedded database without PSP_API_KEY uses the published dev key and prints it at start-up: ' +
    `\`${DEV_PSP_API_KEY}\` (refused whenever DATABASE_URL or PSP_BASE_URL is set, or NODE_ENV=production).`,
};

/** What every /psp operation documents: the provider key, instead of the document's default (a client's API key). */
const PROVIDER_KEY_REQUIRED = [{ [PROVIDER_KEY_SCHEME]: [] }];

const IDEMPOTENCY_KEY = ApiHeader({
  name: 'Idempotency-Key',
  required: true,
  description:
    'One value per charge or refund (a UUID is best). The same key again — concurrently or later — gets the same charge and the ' +
    'same answer (status and body), with Idempotent-Replayed: true; the same key with another body is a 422.',
  schema: { type: 'string', maxLength: 255, example: '3f2b8c1e-5d4a-4b6c-9e7f-0a1b2c3d4e5f' },
});

const REPLAYED = {
  [IDEMPOTENT_REPLAYED_HEADER]: {
    description: 'true when this is the recorded answer of an earlier request with the same key',
    schema: { type: 'string' },
  },
};

function idempotencyKey(raw: string | string[] | undefined): string {
  if (raw === undefined) throw keyMissing();
  return parseIdempotencyKey(raw, problemType);
}

/** Aborts when the client hangs up before its answer was sent: a held-back answer then ends at once. */
function clientGone(res: Response): AbortSignal {
  const gone = new AbortController();
  res.raw.once('close', () => {
    if (!res.raw.writableFinished) gone.abort();
  });
  return gone.signal;
}

/**
 * The sandbox payment provider (docs/contract.md#sandbox-provider). Public to the service's API-key guard: a provider
 * authenticates its merchant (ProviderKeyGuard, the provider's secret key), not our API clients. The service's
 * Idempotency-Key interceptor is inert here (no @Idempotent()): the provider keeps its own keys, in its own schema.
 */
@ApiTags(PSP_SANDBOX_TAG.name)
@Public()
@UseGuards(ProviderKeyGuard)
@Controller('psp')
export class PspSandboxController {
  constructor(
    private readonly sandbox: PspSandboxService,
    private readonly delays: AnswerDelays,
  ) {}

  @Post('charges')
  @ApiOperation({
    operationId: 'pspCreateCharge',
    summary: 'Charge a test card',
    description:
      'Records the charge and its answer in one transaction, then answers — after the delay its test token asks for. ' +
      'tok_visa succeeds; tok_chargeDeclined → 402 (recorded); tok_refundDeclined succeeds but its refunds are declined; ' +
      'tok_flaky → 503 on the first 2 attempts per key, then succeeds; tok_timeout records at once but answers the first attempt ' +
      'per key after 3 × PSP_TIMEOUT_MS; tok_lost records but every answer comes after 3 × PSP_TIMEOUT_MS; tok_unavailable → 503 always; ' +
      'tok_slow answers after PSP_TIMEOUT_MS / 2; tok_processing records nothing for PSP_TIMEOUT_MS / 2, then records and answers at once. ' +
      'Any other source → 400.',
    security: PROVIDER_KEY_REQUIRED,
  })
  @IDEMPOTENCY_KEY
  @ApiCreatedResponse({ type: PspChargeView, description: 'The charge succeeded.', headers: REPLAYED })
  @ApiExtraModels(PspChargeView)
  @ApiResponse({
    status: 402,
    description: 'The card was declined (tok_chargeDeclined). Recorded: a retry of the key gets this again.',
    headers: REPLAYED,
    content: {
      'application/json': {
        schema: { $ref: getSchemaPath(PspChargeView) },
        example: {
          id: 'ch_5f0c3e2a1b9d8c7e6f5a4b3c',
          status: 'failed',
          amountMinor: 2599,
          currency: 'EUR',
          source: 'tok_chargeDeclined',
          failureCode: 'card_declined',
          metadata: { orderId: '6f1c2a9e-3b4d-4c5e-8f70-112233445566', paymentId: '0b7d5e1a-9c2f-4e3d-a1b0-998877665544' },
          createdAt: '2026-11-30T12:00:00.000Z',
        },
      },
    },
  })
  @ApiProblems(
    PSP_PROBLEMS.unauthorized,
    PSP_PROBLEMS.unknownSource,
    PSP_PROBLEMS.invalid,
    PSP_PROBLEMS.keyMissing,
    PSP_PROBLEMS.keyMalformed,
    PSP_PROBLEMS.keyReused,
    PSP_PROBLEMS.unavailable,
  )
  async createCharge(
    @Body() body: CreateChargeDto,
    @Headers('idempotency-key') rawKey: string | undefined,
    @Res() res: Response,
  ): Promise<void> {
    const gone = clientGone(res);
    await this.send(await this.sandbox.createCharge(idempotencyKey(rawKey), body, gone), res, gone);
  }

  @Get('charges')
  @ApiOperation({
    operationId: 'pspListCharges',
    summary: 'Find charges by orderId or paymentId, or list those created after an instant, page by page',
    description:
      'Reads what was recorded, at once (never delayed by a test token). A lookup (orderId and/or paymentId) is how a client finds out ' +
      'what happened to a charge whose answer it never got; it answers every match, hasMore false. A listing (createdAfter, and optionally ' +
      'startingAfter and limit) is how it finds charges it has no record of: at most `limit` charges created strictly after createdAfter, in ' +
      "(createdAt, id) order; while hasMore is true, ask again with startingAfter = the page's last id. createdAt is taken before a charge " +
      'commits, so a charge can land behind a page already read: a sweep reads again from a little before where it last began. ' +
      'A lookup and a listing cannot be mixed.',
    security: PROVIDER_KEY_REQUIRED,
  })
  @ApiOkResponse({ type: PspChargeList })
  @ApiProblems(PSP_PROBLEMS.unauthorized, {
    ...PSP_PROBLEMS.invalid,
    description:
      'Neither orderId, paymentId nor createdAfter given; one of them malformed; a limit outside 1–100; a startingAfter that names no charge; ' +
      'or a lookup mixed with a listing.',
  })
  async findCharges(@Query() query: FindChargesQuery): Promise<PspChargeList> {
    const { orderId, paymentId, createdAfter, startingAfter, limit } = query;
    const listing = (['createdAfter', 'startingAfter', 'limit'] as const).find((field) => query[field] !== undefined);
    if (orderId || paymentId) {
      if (listing) throw invalidQuery(listing, `${listing} belongs to a listing, not to a lookup by orderId or paymentId`);
      return { items: await this.sandbox.findCharges({ orderId, paymentId }), hasMore: false };
    }
    if (createdAfter === undefined) throw lookupNeedsFilter(['orderId', 'paymentId', 'createdAfter']);
    return this.sandbox.listCharges({ createdAfter, startingAfter, limit: limit ?? MAX_CHARGES_PAGE });
  }

  @Post('refunds')
  @ApiOperation({
    operationId: 'pspCreateRefund',
    summary: 'Refund part or all of a charge',
    description:
      'Reserves the amount with one conditional UPDATE, so refunds in parallel never exceed the charge, and records the refund and its answer ' +
      "in one transaction. A refund inherits its charge's test token: its faults and delays, and tok_refundDeclined → 402 (recorded).",
    security: PROVIDER_KEY_REQUIRED,
  })
  @IDEMPOTENCY_KEY
  @ApiCreatedResponse({ type: PspRefundView, description: 'The refund succeeded.', headers: REPLAYED })
  @ApiExtraModels(PspRefundView)
  @ApiResponse({
    status: 402,
    description: 'The refund was declined (a charge made with tok_refundDeclined). Recorded: a retry of the key gets this again.',
    headers: REPLAYED,
    content: {
      'application/json': {
        schema: { $ref: getSchemaPath(PspRefundView) },
        example: {
          id: 're_9a8b7c6d5e4f3a2b1c0d9e8f',
          status: 'failed',
          chargeId: 'ch_5f0c3e2a1b9d8c7e6f5a4b3c',
          amountMinor: 1000,
          failureCode: 'refund_declined',
          metadata: { refundId: '3c9d8e7f-6a5b-4c3d-9e2f-0a1b2c3d4e5f', paymentId: '0b7d5e1a-9c2f-4e3d-a1b0-998877665544' },
          createdAt: '2026-11-30T12:05:00.000Z',
        },
      },
    },
  })
  @ApiProblems(
    PSP_PROBLEMS.unauthorized,
    PSP_PROBLEMS.invalid,
    PSP_PROBLEMS.keyMissing,
    PSP_PROBLEMS.keyMalformed,
    PSP_PROBLEMS.chargeNotFound,
    PSP_PROBLEMS.refundExceedsCharge,
    PSP_PROBLEMS.chargeNotRefundable,
    PSP_PROBLEMS.keyReused,
    PSP_PROBLEMS.unavailable,
  )
  async createRefund(
    @Body() body: CreateRefundDto,
    @Headers('idempotency-key') rawKey: string | undefined,
    @Res() res: Response,
  ): Promise<void> {
    const gone = clientGone(res);
    await this.send(await this.sandbox.createRefund(idempotencyKey(rawKey), body, gone), res, gone);
  }

  @Get('refunds')
  @HttpCode(200)
  @ApiOperation({
    operationId: 'pspListRefunds',
    summary: 'Find refunds by chargeId or refundId',
    description: 'Reads what was recorded, at once (never delayed by a test token).',
    security: PROVIDER_KEY_REQUIRED,
  })
  @ApiOkResponse({ type: PspRefundList })
  @ApiProblems(PSP_PROBLEMS.unauthorized, {
    ...PSP_PROBLEMS.invalid,
    description: 'Neither chargeId nor refundId given, or one is malformed.',
  })
  async findRefunds(@Query() query: FindRefundsQuery): Promise<PspRefundList> {
    if (!query.chargeId && !query.refundId) throw lookupNeedsFilter(['chargeId', 'refundId']);
    return { items: await this.sandbox.findRefunds(query) };
  }

  /**
   * The recorded answer, byte for byte, once its delay is over. The delay holds no connection;
   * if the client hangs up or the app closes first, the answer is dropped as a lost one would be.
   * No answer: the client left while its request was worked on, and nothing was recorded.
   */
  private async send(answer: ProviderAnswer | undefined, res: Response, gone: AbortSignal): Promise<void> {
    if (!answer || !(await this.delays.wait(answer.delayMs, gone))) {
      res.raw.destroy();
      return;
    }
    if (answer.replayed) res.header(IDEMPOTENT_REPLAYED_HEADER, 'true');
    res.status(answer.status).type('application/json').send(answer.body);
  }
}
