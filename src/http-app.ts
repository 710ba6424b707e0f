import { type INestApplication, Logger as NestLogger } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import helmet from '@fastify/helmet';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { DocumentBuilder, SwaggerModule } from '@nestjs/swagger';
import type { FastifyInstance } from 'fastify';
import { Logger } from 'nestjs-pino';
import { readFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import { Registry } from 'prom-client';
import {
  applyHttpRules,
  documentOnEveryOperation,
  PATH_PARAMETER_TOO_LONG,
  httpServerOptions,
  MAX_CONNECTIONS,
  NEST_LOG_LEVELS,
  ProblemException,
  problemSchemas,
  REQUEST_BODY_PROBLEMS,
  sendProblem,
  UNSUPPORTED_MEDIA_TYPE,
} from '#service-kit';
import { AppModule, type AppOptions } from './app.module.js';
import { QuietStartupLogger } from './common/quiet-startup-logger.js';
import { authenticateBeforeBody } from './common/authenticate-before-body.js';
import { httpDurationHistogram } from './metrics/metrics.module.js';
import { PROVIDER_KEY_SCHEME, PROVIDER_KEY_SECURITY_SCHEME, PSP_SANDBOX_TAG } from '#psp-sandbox';

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

/** Where the service serves the repository's pattern pages, so that the links in Swagger UI lead somewhere. */
const PATTERN_PAGES_PATH = '/patterns';

/** One place links each write operation's description to its pattern pages, so a reader of Swagger UI finds the why. */
function linkPatternPages(document: ReturnType<typeof SwaggerModule.createDocument>): void {
  for (const path of Object.values(document.paths)) {
    for (const operation of [path.get, path.post, path.put, path.patch, path.delete]) {
      const pages = operation?.operationId ? PATTERN_PAGES[operation.operationId] : undefined;
      if (!operation || !pages) continue;
      // Markdown: Swagger UI renders each as a link to the page (docs/patterns/<page>.md of the repository).
      const links = pages.map((page) => `[${page}](${PATTERN_PAGES_PATH}/${page}.md)`).join(', ');
      operation.description = `${operation.description ?? ''}\n\nHow it is made safe to repeat: ${links}.`.trim();
    }
  }
}

/**
 * GET /patterns/<page>.md: the repository's docs/patterns pages as Markdown text, for the links above. Only the
 * pages those links name; read from docs/patterns under the working folder (the repository, or the image's /app).
 */
function servePatternPages(fastify: FastifyInstance): void {
  const pages = new Set(Object.values(PATTERN_PAGES).flat());
  const logger = new NestLogger('PatternPages');
  fastify.get<{ Params: { page: string } }>(`${PATTERN_PAGES_PATH}/:page`, async (req, reply) => {
    const page = req.params.page.replace(/\.md$/, '');
    const text = pages.has(page) ? await readFile(resolve('docs/patterns', `${page}.md`), 'utf8').catch(() => undefined) : undefined;
    if (text === undefined)
      sendProblem(ProblemException.of(404, 'not-found', 'Not Found', `There is no pattern page ${req.params.page}.`), req, reply, logger);
    else await reply.type('text/markdown; charset=utf-8').send(text);
    return reply;
  });
}

export function buildOpenApiDocument(app: INestApplication) {
  const config = new DocumentBuilder()
    .setTitle('idempotent-orders')
    .setDescription(
      'An order-and-payment API where every write is safe to repeat. Errors are RFC 9457 application/problem+json. ' +
        'Authorize with an API key (`npm start` on the embedded database prints its dev key at start-up: `dev-secret-change-me`).',
    )
    .setVersion('1')
    .setLicense('MIT', 'https://opensource.org/license/mit')
    // Relative: the API is where this document is served, whatever host and port that is.
    .addServer('/', 'This server')
    .addTag('orders', 'Create orders safely (Idempotency-Key or Submit-Token), read them, change them, move them through their states.')
    .addTag('payments', 'Pay orders and refund payments through the provider: atomic phases under the Idempotency-Key, never two charges.')
    .addTag(
      'webhooks',
      "The provider's events, delivered at least once and applied exactly once (Standard Webhooks signatures; no API key).",
    )
    .addTag('operations', 'Health and metrics for operators; no API key.')
    .addTag(PSP_SANDBOX_TAG.name, PSP_SANDBOX_TAG.description)
    .addBearerAuth(
      {
        type: 'http',
        scheme: 'bearer',
        // DocumentBuilder's default is "JWT"; these are opaque API keys.
        bearerFormat: 'API key',
        description:
          'The secret of an API key from API_KEYS (clientId:secret pairs). `npm start` on the embedded database without API_KEYS ' +
          'uses the dev key and prints it at start-up: `dev-secret-change-me` (refused whenever DATABASE_URL is set).',
      },
      BEARER_AUTH,
    )
    // The sandbox provider's own key, which its operations name instead of a client's.
    .addBearerAuth(PROVIDER_KEY_SECURITY_SCHEME, PROVIDER_KEY_SCHEME)
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
  documentOnEveryOperation(document, [PATH_PARAMETER_TOO_LONG], { pathsWithParameters: true });
  document.components = { ...document.components, schemas: { ...document.components?.schemas, ...problemSchemas() } };
  return document;
}

/**
 * Helmet's headers on every answer (nosniff, no framing, no referrer, HSTS once behind TLS), with a Content Security
 * Policy Swagger UI runs under: its scripts and styles from here, its inline styles and data: icons, and nothing
 * else loaded, framed or submitted. `upgrade-insecure-requests` is left out: `npm start` serves plain http.
 */
const SECURITY_HEADERS = {
  contentSecurityPolicy: {
    useDefaults: false,
    directives: {
      defaultSrc: ["'self'"],
      scriptSrc: ["'self'"],
      styleSrc: ["'self'", "'unsafe-inline'"],
      imgSrc: ["'self'", 'data:'],
      connectSrc: ["'self'"],
      fontSrc: ["'self'"],
      objectSrc: ["'none'"],
      baseUri: ["'self'"],
      formAction: ["'self'"],
      frameAncestors: ["'none'"],
    },
  },
  frameguard: { action: 'deny' as const },
  referrerPolicy: { policy: 'no-referrer' as const },
};

/** Everything main.ts and the tests share: the app exactly as it serves traffic. */
export async function createHttpApp(options: AppOptions): Promise<NestFastifyApplication> {
  // req.ip: the client's address, X-Forwarded-For believed from TRUST_PROXY's proxies only (failed authentications are limited by it).
  const adapter = new FastifyAdapter({ ...httpServerOptions(), trustProxy: options.config.trustProxy ?? false });
  const app = await NestFactory.create<NestFastifyApplication>(AppModule.forRoot(options), adapter, {
    bufferLogs: true,
    bodyParser: false,
  });
  app.useLogger(new QuietStartupLogger(app.get(Logger)));
  // Nest's levels follow LOG_LEVEL, so that code asking Logger.isLevelEnabled (the idempotency layer's line per request)
  // builds no line that pino would then drop.
  NestLogger.overrideLogger(NEST_LOG_LEVELS[options.config.logLevel]);
  const fastify = app.getHttpAdapter().getInstance();
  fastify.server.maxConnections = MAX_CONNECTIONS;
  // First: an answer given by any later hook (a refused key, a refused body) carries the headers too.
  await app.register(helmet, SECURITY_HEADERS);
  const duration = httpDurationHistogram(app.get(Registry));
  // Before the body hooks (applyHttpRules), so that a request they refuse carries its id too.
  fastify.addHook('onRequest', (req, reply, done) => {
    reply.header('X-Request-Id', req.id);
    done();
  });
  authenticateBeforeBody(app);
  fastify.addHook('onResponse', (req, reply, done) => {
    // The route pattern, not the URL: one series per endpoint, however many ids there are.
    duration.observe(
      { method: req.method, route: req.routeOptions.url ?? 'unmatched', status: String(reply.statusCode) },
      reply.elapsedTime / 1000,
    );
    done();
  });
  applyHttpRules(app);
  servePatternPages(fastify);
  SwaggerModule.setup('docs', app, () => buildOpenApiDocument(app), {
    jsonDocumentUrl: 'docs-json',
    // No validator badge: it would send the document to validator.swagger.io (and the CSP refuses it).
    swaggerOptions: { persistAuthorization: true, validatorUrl: null },
  });
  return app;
}
