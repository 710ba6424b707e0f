import { BadRequestException, Logger as NestLogger, UnsupportedMediaTypeException } from '@nestjs/common';
import type { NestFastifyApplication } from '@nestjs/platform-fastify';
import type { ValidationError } from 'class-validator';
import type { FastifyHttpOptions, FastifyInstance } from 'fastify';
import type { IncomingMessage, Server } from 'node:http';
import { STATUS_CODES } from 'node:http';
import type { Socket } from 'node:net';
import secureJson from 'secure-json-parse';
import { plainProblem, PROBLEM_CONTENT_TYPE, ProblemException } from './problem.js';
import { sendProblem } from './problem.filter.js';
import { keepsRawBody } from './raw-body.js';
import { requestIdOf } from './request-id.js';
import { CompiledValidationPipe } from './compiled-validation.pipe.js';

/**
 * The largest body we parse. A create has at most 100 short lines (~15 KiB of JSON); 64 KiB leaves
 * room and bounds what one request can make us parse.
 */
export const BODY_LIMIT_BYTES = 64 * 1024;
/** How long a client has to send a whole request: headers and body (see httpServerOptions). */
export const REQUEST_RECEIVE_TIMEOUT_MS = 10_000;
/**
 * Open connections one process accepts; more are refused at once. Two cores serve ~1,000 req/s here; 1,024 keep-alive
 * clients is far past what they can use, and it keeps a flood of idle sockets from taking every file descriptor.
 */
export const MAX_CONNECTIONS = 1_024;

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

/** application/json or application/*+json, parameters allowed: the media types we read as JSON. */
const JSON_MEDIA_TYPE = /^\s*application\/(?:[^;\s/]+\+)?json\s*(?:;|$)/i;
const CHARSET_PARAMETER = /;\s*charset\s*=\s*"?([^";\s]*)"?/i;

/**
 * How every JSON body is read, by every app that calls applyHttpRules:
 * - a body that is not JSON is refused before anything runs (415), rather than silently ignored;
 * - at most 64 KiB, parsed once; an empty body is {};
 * - a route marked @KeepRawBody() keeps the exact bytes sent (a Buffer in req.body): a signature is over them;
 * - a parsed body too deep, or with text PostgreSQL cannot store, is a 400 before anything reads it.
 */
function acceptJsonBodies(fastify: FastifyInstance): void {
  fastify.addHook('onRequest', (req, _reply, done) => {
    const hasBody = Number(req.headers['content-length'] ?? 0) > 0 || req.headers['transfer-encoding'] !== undefined;
    if (!hasBody) return done();
    const contentType = req.headers['content-type'] ?? '';
    if (!JSON_MEDIA_TYPE.test(contentType)) {
      return done(
        ProblemException.of(415, 'unsupported-media-type', 'Unsupported Media Type', 'Send the request body as application/json.'),
      );
    }
    // The parser reads UTF-8 only: text in another charset would be stored garbled, not refused.
    const charset = CHARSET_PARAMETER.exec(contentType)?.[1];
    if (charset !== undefined && !/^utf-?8$/i.test(charset))
      return done(new UnsupportedMediaTypeException(`unsupported charset "${charset.toUpperCase()}"`));
    done();
  });
  fastify.removeAllContentTypeParsers();
  // No body under another media type (curl -d '' sends a form type): nothing to parse, as if none were named.
  // A body under one never gets here: the hook above refused it.
  fastify.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit: BODY_LIMIT_BYTES }, (_req, _body, done) => done(null, undefined));
  fastify.addContentTypeParser(JSON_MEDIA_TYPE, { parseAs: 'buffer', bodyLimit: BODY_LIMIT_BYTES }, (req, body: Buffer, done) => {
    if (keepsRawBody(req)) return done(null, body);
    if (body.length === 0) return done(null, {});
    try {
      // A "__proto__" or "constructor.prototype" key is refused, so no later copy of the body can reach a prototype.
      done(null, secureJson.parse(body, undefined, { protoAction: 'error', constructorAction: 'error' }));
    } catch (err) {
      done(new BadRequestException((err as Error).message));
    }
  });
  fastify.addHook('preValidation', (req, _reply, done) => {
    // A webhook's raw bytes: its consumer reads them once the signature says who sent them.
    if (req.body === undefined || Buffer.isBuffer(req.body)) return done();
    const defect = bodyDefect(req.body, MAX_JSON_DEPTH);
    done(defect ? ProblemException.of(400, 'invalid-json-body', 'JSON body not accepted', defect) : undefined);
  });
}

/** The HTTP server as the service and the sandbox provider's own process run it. */
export function httpServerOptions(): FastifyHttpOptions<Server> {
  const logger = new NestLogger('HttpServer');
  return {
    bodyLimit: BODY_LIMIT_BYTES,
    // A whole request (headers and at most 64 KiB of body) arrives within 10 s: that is 50 kbit/s, slower than any client
    // an API serves. A client trickling its request (one byte every few seconds) loses its socket then, not after 5 min.
    requestTimeout: REQUEST_RECEIVE_TIMEOUT_MS,
    // Node checks those deadlines every 30 s by default; once a second keeps the 10 s a bound, not a hint.
    http: { headersTimeout: REQUEST_RECEIVE_TIMEOUT_MS, connectionsCheckingInterval: 1_000 },
    // URLs as people type them: /Orders/ is /orders.
    routerOptions: { caseSensitive: false, ignoreTrailingSlash: true },
    // X-Request-Id: the caller's when it is a sane token, else a new UUID (pino-http logs the same one).
    genReqId: requestIdOf,
    // What the router refuses before Nest sees the request (a malformed URL, a path parameter over 100
    // characters) is a problem too, with its request id.
    frameworkErrors: (error, req, reply) => {
      reply.header('X-Request-Id', req.id);
      sendProblem(error, req, reply, logger);
    },
    // Served, then closed (see closeConnectionsWhenStopping), rather than Fastify's own non-problem 503.
    return503OnClosing: false,
    clientErrorHandler: refuseMalformedRequest,
  };
}

/**
 * What Node's HTTP parser refuses before there is a request to route (not HTTP, two Content-Lengths, headers over
 * 16 KiB, the request timeout) is a problem too. There is no reply object yet: written on the socket, as Fastify's
 * own handler writes its JSON, and the connection closed (the parser cannot tell where the next request begins).
 */
function refuseMalformedRequest(err: Error & { code?: string }, socket: Socket): void {
  // A reset connection has nobody left to answer.
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  const [status, detail] =
    err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
      ? [408, 'The request did not arrive in time.']
      : err.code === 'HPE_HEADER_OVERFLOW'
        ? [431, 'The request headers are larger than 16 KiB.']
        : [400, 'The request is not valid HTTP.'];
  const body = JSON.stringify(plainProblem(status, detail));
  if (socket.writable) {
    socket.write(
      `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nContent-Type: ${PROBLEM_CONTENT_TYPE}; charset=utf-8\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
  }
  socket.destroy(err);
}

/**
 * A stop (stopOnSignals) closes the server, which then waits for every open connection. One kept alive after
 * its last answer (nginx keeps a pool of them) would hold the stop for Fastify's 72 s keep-alive timeout, past
 * the stop's deadline. So while stopping, every answer closes its connection; a connection opened and never used is
 * closed at once (Node's closeIdleConnections counts it busy); and idle ones are closed every 100 ms, for a connection
 * that goes idle after an answer written on the raw response (the sandbox's held answers skip onSend).
 */
function closeConnectionsWhenStopping(fastify: FastifyInstance): void {
  let stopping = false;
  const unused = new Set<Socket>();
  fastify.server.on('connection', (socket: Socket) => {
    unused.add(socket);
    socket.once('close', () => unused.delete(socket));
  });
  // Per request only a Set delete: the hot path pays nothing else for this.
  fastify.server.on('request', (req: IncomingMessage) => unused.delete(req.socket));
  fastify.addHook('preClose', (done) => {
    stopping = true;
    for (const socket of unused) socket.destroy();
    const closeIdle = setInterval(() => fastify.server.closeIdleConnections(), 100).unref();
    fastify.server.once('close', () => clearInterval(closeIdle));
    done();
  });
  fastify.addHook('onSend', (_req, reply, payload, done) => {
    if (stopping) reply.header('Connection', 'close');
    done(null, payload);
  });
}

/** What the service and the sandbox provider's own process share: how bodies are read and checked, and how a stop ends. */
export function applyHttpRules(app: NestFastifyApplication): void {
  const fastify = app.getHttpAdapter().getInstance();
  acceptJsonBodies(fastify);
  closeConnectionsWhenStopping(fastify);
  app.useGlobalPipes(
    // ValidationPipe, with each DTO's rules planned once (compiled-validation.pipe.ts): the same verdicts and messages.
    new CompiledValidationPipe({
      whitelist: true,
      forbidNonWhitelisted: true,
      transform: true,
      forbidUnknownValues: true,
      exceptionFactory: validationProblem,
    }),
  );
}
