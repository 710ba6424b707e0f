import { createParamDecorator, type ExecutionContext } from '@nestjs/common';
import type { FastifyRequest } from 'fastify';

/** The authenticated client's id (set by ApiKeyGuard). */
export const ClientId = createParamDecorator((_: unknown, ctx: ExecutionContext): string => {
  const clientId = ctx.switchToHttp().getRequest<FastifyRequest>().clientId;
  if (!clientId) throw new Error('ClientId used on a route without ApiKeyGuard');
  return clientId;
});
