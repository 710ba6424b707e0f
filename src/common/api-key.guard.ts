import { type CanActivate, type ExecutionContext, Injectable } from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import type { FastifyRequest as Request } from 'fastify';
import { PUBLIC_ROUTE } from '#service-kit';
import { ApiKeys } from './api-keys.js';

/**
 * Every route but the @Public() ones needs an API key. The key is normally checked earlier, when the headers are in
 * (authenticateBeforeBody); this guard is the rule itself, for any route that check does not cover.
 */
@Injectable()
export class ApiKeyGuard implements CanActivate {
  constructor(
    private readonly reflector: Reflector,
    private readonly apiKeys: ApiKeys,
  ) {}

  async canActivate(context: ExecutionContext): Promise<boolean> {
    if (this.reflector.getAllAndOverride<boolean>(PUBLIC_ROUTE, [context.getHandler(), context.getClass()])) return true;
    const req = context.switchToHttp().getRequest<Request>();
    req.clientId ??= await this.apiKeys.authenticate(req);
    return true;
  }
}
