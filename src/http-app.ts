import { type INestApplication, ValidationPipe } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import type { NestExpressApplication } from '@nestjs/platform-express';
import { DocumentBuilder, SwaggerModule } from '@nestjs/swagger';
import type { ValidationError } from 'class-validator';
import type { NextFunction, Request, Response } from 'express';
import { Logger } from 'nestjs-pino';
import { Registry } from 'prom-client';
import { AppModule, type AppOptions, assignRequestId } from './app.module.js';
import { documentOnEveryOperation, problemSchemas, REQUEST_BODY_PROBLEMS, UNSUPPORTED_MEDIA_TYPE } from './common/api-problem-responses.js';
import { ProblemException } from './common/problem.js';
import { httpDurationHistogram } from './metrics/metrics.module.js';
import { PSP_SANDBOX_TAG } from './psp-sandbox/psp-sandbox.controller.js';
import { isWebhookDelivery } from './webhooks/webhook-raw-body.js';

/**
 * The largest body we parse. A create has at most 100 short lines (~15 KiB of JSON); 64 KiB leaves
 * room and bounds what one request can make us parse.
 */
export const BODY_LIMIT = '64kb';

function flattenErrors(errors: ValidationError[], prefix = ''): { field: string; messages: string[] }[] {
  return errors.flatMap((e) => {
    const field = prefix ? `${prefix}.${e.property}` : e.property;
    const own = e.constraints ? [{ field, messages: Object.values(e.constraints) }] : [];
    return [...own, ...flattenErrors(e.children ?? [], field)];
  });
}

export function validationProblem(errors: ValidationError[]): ProblemException {
  const flat = flattenErrors(errors);
  const detail = flat.map((e) => `${e.field}: ${e.messages.join('; ')}`).join(' | ') || 'The request is not valid.';
  return ProblemException.of(400, 'validation-failed', 'Validation failed', detail, { errors: flat });
}

/**
 * Deeper JSON than any request of ours (an order is 3 levels) is refused before anything walks
 * it recursively: 10 000 nested arrays fit in 20 KB and would overflow the stack of the
 * validator and the fingerprint (a 500 on client input). JSON.parse itself copes.
 */
export const MAX_JSON_DEPTH = 32;

/** Text PostgreSQL cannot store as sent: NUL is refused by text and jsonb, and a lone surrogate is
 * silently replaced, so a repeated create would no longer compare equal to what was stored. */
const unstorable = (text: string) => text.includes('\u0000') || !text.isWellFormed();

/**
 * Why a parsed body must be refused before anything else reads it, or undefined when it is fine.
 * Iterative, so the check itself cannot overflow the stack it protects.
 */
export function bodyDefect(value: unknown, maxDepth: number): string | undefined {
  const stack: [unknown, number][] = [[value, 1]];
  while (stack.length) {
    const [node, depth] = stack.pop()!;
    if (typeof node === 'string') {
      if (unstorable(node)) return 'A string in the JSON body contains a NUL character or an unpaired surrogate.';
      continue;
    }
    if (node === null || typeof node !== 'object') continue;
    if (depth > maxDepth) return `The JSON body is nested deeper than ${maxDepth} levels.`;
    for (const [key, child] of Object.entries(node)) {
      if (unstorable(key)) return 'A key in the JSON body contains a NUL character or an unpaired surrogate.';
      stack.push([child, depth + 1]);
    }
  }
  return undefined;
}

export function refuseUnsafeJson(req: Request, _res: Response, next: NextFunction): void {
  // A webhook's raw bytes: its consumer reads them once the signature says who sent them.
  if (Buffer.isBuffer(req.body)) return next();
  const defect = bodyDefect(req.body, MAX_JSON_DEPTH);
  next(defect ? ProblemException.of(400, 'invalid-json-body', 'JSON body not accepted', defect) : undefined);
}

/** A body we cannot read as JSON is refused before anything runs (415), rather than silently ignored. */
export function requireJsonBody(req: Request, _res: Response, next: NextFunction): void {
  const hasBody = Number(req.headers['content-length'] ?? 0) > 0 || req.headers['transfer-encoding'] !== undefined;
  if (hasBody && !req.is('application/json') && !req.is('application/*+json')) {
    next(ProblemException.of(415, 'unsupported-media-type', 'Unsupported Media Type', 'Send the request body as application/json.'));
    return;
  }
  next();
}

/** The name of the API-key security scheme (@ApiBearerAuth() refers to it by this default name). */
const BEARER_AUTH = 'bearer';

/** The docs/patterns pages (in the repository) that explain how each write is made safe to repeat. */
const PATTERN_PAGES: Record<string, string[]> = {
  createOrder: ['idempotency-key', 'concurrent-duplicates', 'natural-key', 'submit-tokens'],
  issueSubmitToken: ['submit-tokens'],
  cancelOrder: ['state-machine', 'idempotency-key'],
  shipOrder: ['state-machine', 'idempotency-key'],
  deliverOrder: ['state-machine', 'idempotency-key'],
  updateOrderDetails: ['optimistic-locking'],
  payOrder: ['phased-external-calls', 'outbound-retries', 'reconciliation'],
  refundPayment: ['phased-external-calls', 'outbound-retries', 'reconciliation'],
  receive: ['webhook-consumer'],
};

/** One place links each write operation's description to its pattern pages, so a reader of Swagger UI finds the why. */
function linkPatternPages(document: ReturnType<typeof SwaggerModule.createDocument>): void {
  for (const path of Object.values(document.paths)) {
    for (const operation of [path.get, path.post, path.put, path.patch, path.delete]) {
      const pages = operation?.operationId ? PATTERN_PAGES[operation.operationId] : undefined;
      if (!operation || !pages) continue;
      const links = pages.map((page) => `docs/patterns/${page}.md`).join(', ');
      operation.description = `${operation.description ?? ''}\n\nHow it is made safe to repeat: ${links} (in the repository).`.trim();
    }
  }
}

export function buildOpenApiDocument(app: INestApplication) {
  const config = new DocumentBuilder()
    .setTitle('idempotent-orders')
    .setDescription(
      'An order-and-payment API where every write is safe to repeat. Errors are RFC 9457 application/problem+json. ' +
        'Authorize with an API key (the dev key is printed at start-up).',
    )
    .setVersion('1')
    .setLicense('MIT', 'https://opensource.org/license/mit')
    // Relative: the API is where this document is served, whatever host and port that is.
    .addServer('/', 'This server')
    .addTag('orders', 'Create orders safely (Idempotency-Key or Submit-Token), read them, change them, move them through their states.')
    .addTag('payments', 'Pay orders and refund payments through the provider: atomic phases under the Idempotency-Key, never two charges.')
    .addTag('webhooks', "The provider's events, delivered at least once and applied exactly once (Standard Webhooks signatures; no API key).")
    .addTag('operations', 'Health and metrics for operators; no API key.')
    .addTag(PSP_SANDBOX_TAG.name, PSP_SANDBOX_TAG.description)
    .addBearerAuth({ type: 'http', scheme: 'bearer', description: 'An API key from API_KEYS' }, BEARER_AUTH)
    // Every operation needs the key unless it says otherwise (security: [] on the public ones).
    .addSecurityRequirements(BEARER_AUTH)
    .build();
  const document = SwaggerModule.createDocument(app, config, {
    // The method name (createOrder, getOrder, …): what a generated client calls the operation.
    operationIdFactory: (_controllerKey, methodKey) => methodKey,
  });
  linkPatternPages(document);
  // Before problemSchemas(): documenting a problem registers its type's schema.
  documentOnEveryOperation(document, [...REQUEST_BODY_PROBLEMS, UNSUPPORTED_MEDIA_TYPE]);
  document.components = { ...document.components, schemas: { ...document.components?.schemas, ...problemSchemas() } };
  return document;
}

/** Everything main.ts and the tests share: the app exactly as it serves traffic. */
export async function createHttpApp(options: AppOptions): Promise<NestExpressApplication> {
  const app = await NestFactory.create<NestExpressApplication>(AppModule.forRoot(options), {
    bufferLogs: true,
    bodyParser: false,
  });
  app.useLogger(app.get(Logger));
  app.disable('x-powered-by');
  app.set('etag', false);
  // First of all, so that even a request refused by the body parser carries its id.
  app.use(assignRequestId);
  const duration = httpDurationHistogram(app.get(Registry));
  app.use((req: Request, res: Response, next: NextFunction) => {
    const end = duration.startTimer();
    res.once('finish', () => {
      // The route pattern, not the URL: one series per endpoint, however many ids there are.
      const pattern = (req.route as { path?: string } | undefined)?.path;
      const route = pattern ? `${req.baseUrl}${pattern}` : 'unmatched';
      end({ method: req.method, route, status: String(res.statusCode) });
    });
    next();
  });
  app.use(requireJsonBody);
  // The webhook route keeps the exact bytes sent (a Buffer in req.body): its signature is over them.
  // Registered before the JSON parser, which then skips that request; other routes only pay the URL test.
  app.useBodyParser('raw', { limit: BODY_LIMIT, type: isWebhookDelivery });
  app.useBodyParser('json', { limit: BODY_LIMIT, type: ['application/json', 'application/*+json'] });
  app.use(refuseUnsafeJson);
  app.useGlobalPipes(
    new ValidationPipe({
      whitelist: true,
      forbidNonWhitelisted: true,
      transform: true,
      forbidUnknownValues: true,
      exceptionFactory: validationProblem,
    }),
  );
  SwaggerModule.setup('docs', app, () => buildOpenApiDocument(app), {
    jsonDocumentUrl: 'docs-json',
    swaggerOptions: { persistAuthorization: true },
  });
  return app;
}
