import { type CanActivate, type ExecutionContext, Inject, Injectable } from '@nestjs/common';
import type { FastifyRequest } from 'fastify';
import { timingSafeEqual } from 'node:crypto';
import { bearerToken, secretDigest } from '#service-kit';
import { providerKeyRefused } from './psp-problems.js';
import { SANDBOX_OPTIONS, type SandboxOptions } from './sandbox-options.js';

/**
 * `Authorization: Bearer <key>` against the provider's secret key, as a real provider authenticates its merchant:
 * without it the sandbox records no charge, signs no event and tells nothing of anyone's charges (issue 38).
 */
@Injectable()
export class ProviderKeyGuard implements CanActivate {
  private readonly key: Buffer;

  constructor(@Inject(SANDBOX_OPTIONS) options: SandboxOptions) {
    this.key = secretDigest(options.apiKey);
  }

  canActivate(context: ExecutionContext): boolean {
    const token = bearerToken(context.switchToHttp().getRequest<FastifyRequest>().headers.authorization);
    if (token === undefined) throw providerKeyRefused('Send the provider\'s secret key as "Authorization: Bearer <key>".');
    if (!timingSafeEqual(secretDigest(token), this.key)) throw providerKeyRefused('The provider key is not valid.');
    return true;
  }
}
