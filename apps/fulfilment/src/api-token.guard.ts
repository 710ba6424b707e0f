import { type CanActivate, type ExecutionContext, Inject, Injectable } from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { timingSafeEqual } from 'node:crypto';
import type { FastifyRequest } from 'fastify';
import { bearerToken, ProblemException, PUBLIC_ROUTE, secretDigest } from '#service-kit';
import type { FulfilmentConfig } from './config.js';
import { FULFILMENT_CONFIG } from './fulfilment.module-tokens.js';

function unauthorized(detail: string): ProblemException {
  return ProblemException.of(401, 'unauthorized', 'Unauthorized', detail, {}, { 'WWW-Authenticate': 'Bearer' });
}

/** `Authorization: Bearer <FULFILMENT_API_TOKEN>` on every HTTP route not marked @Public(), compared in constant time. */
@Injectable()
export class ApiTokenGuard implements CanActivate {
  private readonly expected: Buffer;

  constructor(
    private readonly reflector: Reflector,
    @Inject(FULFILMENT_CONFIG) config: FulfilmentConfig,
  ) {
    this.expected = secretDigest(config.apiToken);
  }

  canActivate(context: ExecutionContext): boolean {
    if (this.reflector.getAllAndOverride<boolean>(PUBLIC_ROUTE, [context.getHandler(), context.getClass()])) return true;
    const token = bearerToken(context.switchToHttp().getRequest<FastifyRequest>().headers.authorization);
    if (token === undefined) throw unauthorized('Send the token as "Authorization: Bearer <FULFILMENT_API_TOKEN>".');
    if (!timingSafeEqual(secretDigest(token), this.expected)) throw unauthorized('The token is not valid.');
    return true;
  }
}
