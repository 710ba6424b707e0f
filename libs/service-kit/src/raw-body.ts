import { RouteConfig } from '@nestjs/platform-fastify';
import type { FastifyRequest } from 'fastify';

/**
 * Marks the one route whose body must stay the exact bytes sent (a Buffer in req.body): a signature is
 * over them, and re-serialised JSON would not match. http-app's JSON parser reads this; every other
 * route gets parsed JSON.
 */
export const KeepRawBody = () => RouteConfig({ keepRawBody: true });

export const keepsRawBody = (req: FastifyRequest): boolean =>
  (req.routeOptions.config as { keepRawBody?: unknown } | undefined)?.keepRawBody === true;
