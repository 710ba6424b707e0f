import { Logger, RequestMethod } from '@nestjs/common';
import { METHOD_METADATA, PATH_METADATA } from '@nestjs/common/constants.js';
import { DiscoveryService, MetadataScanner, Reflector } from '@nestjs/core';
import type { NestFastifyApplication } from '@nestjs/platform-fastify';
import { ProblemException, PUBLIC_ROUTE, sendProblem } from '#service-kit';
import { ApiKeys } from './api-keys.js';

/** "POST /orders/:id/cancel": a route as Fastify names it in `req.routeOptions`. */
const routeName = (method: string, url: string) => `${method} ${url}`;

/** Every route ApiKeyGuard guards (no @Public() on it or its controller), found from the controllers' own metadata. */
function guardedRoutes(app: NestFastifyApplication): Set<string> {
  const reflector = app.get(Reflector);
  const scanner = app.get(MetadataScanner);
  const routes = new Set<string>();
  for (const { instance, metatype } of app.get(DiscoveryService).getControllers()) {
    if (!instance || !metatype) continue;
    const prefixes = [Reflect.getMetadata(PATH_METADATA, metatype) as string | string[]].flat();
    for (const name of scanner.getAllMethodNames(Object.getPrototypeOf(instance) as object)) {
      const handler = (instance as Record<string, unknown>)[name] as (...args: unknown[]) => unknown;
      const paths = Reflect.getMetadata(PATH_METADATA, handler) as string | string[] | undefined;
      if (paths === undefined || reflector.getAllAndOverride<boolean>(PUBLIC_ROUTE, [handler, metatype])) continue;
      const method = RequestMethod[Reflect.getMetadata(METHOD_METADATA, handler) as RequestMethod];
      for (const prefix of prefixes)
        for (const path of [paths].flat()) {
          const url = `/${[prefix, path]
            .flatMap((part) => part.split('/'))
            .filter(Boolean)
            .join('/')}`;
          routes.add(routeName(method, url));
        }
    }
  }
  return routes;
}

/**
 * Checks the API key as soon as a guarded request's headers are in, before its body is read and parsed: an anonymous
 * caller gets 401 (or 429) for free, not a 400 about a 64 KiB body it had no right to send. ApiKeyGuard stays the
 * rule for every route; this answers earlier on the routes the guard's own metadata says it guards.
 */
export function authenticateBeforeBody(app: NestFastifyApplication): void {
  const logger = new Logger('ApiKeys');
  // Resolved on the first request: the controllers are known once the app is initialised.
  let resolved: { guarded: Set<string>; apiKeys: ApiKeys } | undefined;
  app
    .getHttpAdapter()
    .getInstance()
    .addHook('onRequest', async (req, reply) => {
      const { guarded, apiKeys } = (resolved ??= { guarded: guardedRoutes(app), apiKeys: app.get(ApiKeys) });
      if (!guarded.has(routeName(req.routeOptions.method as string, req.routeOptions.url ?? ''))) return;
      try {
        req.clientId = await apiKeys.authenticate(req);
      } catch (err) {
        if (!(err instanceof ProblemException)) throw err;
        sendProblem(err, req, reply, logger);
        return reply;
      }
    });
}
