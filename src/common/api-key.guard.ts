import { type CanActivate, type ExecutionContext, Inject, Injectable } from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { createHash, timingSafeEqual } from 'node:crypto';
import type { FastifyRequest as Request } from 'fastify';
import { APP_CONFIG } from '../config/config.module.js';
import type { AppConfig } from '../config/app-config.js';
import { ProblemException, PUBLIC_ROUTE } from '#service-kit';

declare module 'fastify' {
  interface FastifyRequest {
    /** The authenticated API client; everything it owns is scoped by this id. */
    clientId?: string;
  }
}

const digest = (value: string) => createHash('sha256').update(value).digest();

function unauthorized(detail: string): ProblemException {
  return ProblemException.of(401, 'unauthorized', 'Unauthorized', detail, {}, { 'WWW-Authenticate': 'Bearer' });
}

/** `Authorization: Bearer <secret>` against API_KEYS. Every configured secret is compared, in constant time, so timing reveals nothing. */
@Injectable()
export class ApiKeyGuard implements CanActivate {
  private readonly clients: { clientId: string; digest: Buffer }[];

  constructor(
    private readonly reflector: Reflector,
    @Inject(APP_CONFIG) config: AppConfig,
  ) {
    this.clients = config.apiClients.map((c) => ({ clientId: c.clientId, digest: digest(c.secret) }));
  }

  canActivate(context: ExecutionContext): boolean {
    if (this.reflector.getAllAndOverride<boolean>(PUBLIC_ROUTE, [context.getHandler(), context.getClass()])) return true;
    const req = context.switchToHttp().getRequest<Request>();
    const header = req.headers.authorization;
    const match = header ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
    if (!match) throw unauthorized('Send an API key as "Authorization: Bearer <key>".');
    // Hashing first gives equal-length buffers, so timingSafeEqual leaks neither content nor length.
    const presented = digest(match[1]);
    let clientId: string | undefined;
    for (const client of this.clients) {
      if (timingSafeEqual(presented, client.digest)) clientId = client.clientId;
    }
    if (!clientId) throw unauthorized('The API key is not valid.');
    req.clientId = clientId;
    return true;
  }
}
