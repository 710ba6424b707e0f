import { type CanActivate, type ExecutionContext, Inject, Injectable } from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { createHash, timingSafeEqual } from 'node:crypto';
import type { FastifyRequest } from 'fastify';
import { ProblemException, PUBLIC_ROUTE } from '#service-kit';
import type { FulfilmentConfig } from './config.js';
import { FULFILMENT_CONFIG } from './fulfilment.module-tokens.js';

const digest = (value: string) => createHash('sha256').update(value).digest();

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
    this.expected = digest(config.apiToken);
  }

  canActivate(context: ExecutionContext): boolean {
    if (this.reflector.getAllAndOverride<boolean>(PUBLIC_ROUTE, [context.getHandler(), context.getClass()])) return true;
    const header = context.switchToHttp().getRequest<FastifyRequest>().headers.authorization;
    const match = header ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
    if (!match) throw unauthorized('Send the token as "Authorization: Bearer <FULFILMENT_API_TOKEN>".');
    // Hashing first gives equal-length buffers, so timingSafeEqual leaks neither content nor length.
    if (!timingSafeEqual(digest(match[1]), this.expected)) throw unauthorized('The token is not valid.');
    return true;
  }
}
