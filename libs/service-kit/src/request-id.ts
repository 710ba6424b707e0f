import type { IncomingMessage } from 'node:http';
import { randomUUID } from 'node:crypto';

/** A caller's X-Request-Id is kept when it is a sane token, so logs correlate across services. */
const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/**
 * X-Request-Id: the caller's when it is a sane token, else a new UUID. Fastify's genReqId (the service sends it
 * back on every response) and pino-http's both call this; the id is kept on the raw request, so they agree.
 */
export function requestIdOf(req: IncomingMessage): string {
  const withId = req as IncomingMessage & { id?: unknown };
  if (typeof withId.id === 'string') return withId.id;
  const given = req.headers['x-request-id'];
  const id = typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID();
  withId.id = id;
  return id;
}
