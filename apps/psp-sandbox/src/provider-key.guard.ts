import { type CanActivate, type ExecutionContext, Inject, Injectable } from '@nestjs/common';
import type { FastifyRequest } from 'fastify';
import { createHash, timingSafeEqual } from 'node:crypto';
import { providerKeyRefused } from './psp-problems.js';
import { SANDBOX_OPTIONS, type SandboxOptions } from './sandbox-options.js';

const digest = (value: string) => createHash('sha256').update(value).digest();

/**
 * `Authorization: Bearer <key>` against the provider's secret key, as a real provider authenticates its merchant:
 * without it the sandbox records no charge, signs no event and tells nothing of anyone's charges (issue 38).
 */
@Injectable()
export class ProviderKeyGuard implements CanActivate {
  private readonly key: Buffer;

  constructor(@Inject(SANDBOX_OPTIONS) options: SandboxOptions) {
    this.key = digest(options.apiKey);
  }

  canActivate(context: ExecutionContext): boolean {
    const header = context.switchToHttp().getRequest<FastifyRequest>().headers.authorization;
    const match = header ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null;
    if (!match) throw providerKeyRefused('Send the provider\'s secret key as "Authorization: Bearer <key>".');
    // Digests first: equal lengths for timingSafeEqual, so timing tells neither the key's content nor its length.
    if (!timingSafeEqual(digest(match[1]), this.key)) throw providerKeyRefused('The provider key is not valid.');
    return true;
  }
}
