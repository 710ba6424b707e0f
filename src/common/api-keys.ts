import { Inject, Injectable } from '@nestjs/common';
import { timingSafeEqual } from 'node:crypto';
import type { FastifyRequest as Request } from 'fastify';
import { RateLimiterMemory, RateLimiterRes } from 'rate-limiter-flexible';
import { APP_CONFIG } from '../config/config.module.js';
import type { AppConfig } from '../config/app-config.js';
import { bearerToken, ProblemException, secretDigest } from '#service-kit';

declare module 'fastify' {
  interface FastifyRequest {
    /** The authenticated API client; everything it owns is scoped by this id. */
    clientId?: string;
  }
}

/**
 * Wrong keys one source address may present per minute; past that, the address is refused for a minute, its good
 * keys too (else 429 versus 200 would still answer each guess). Twenty covers a client with a stale key retrying
 * around a rotation; a guesser gets 28,800 tries a day, nothing against a 128-bit key, and a log line per block.
 */
export const FAILED_AUTHENTICATIONS_PER_MINUTE = 20;
export const FAILED_AUTHENTICATION_BLOCK_SECONDS = 60;

const SEND_A_KEY = 'Send an API key as "Authorization: Bearer <key>".';

function unauthorized(detail: string): ProblemException {
  return ProblemException.of(401, 'unauthorized', 'Unauthorized', detail, {}, { 'WWW-Authenticate': 'Bearer' });
}

function tooManyFailures(res: RateLimiterRes): ProblemException {
  const seconds = Math.max(1, Math.ceil(res.msBeforeNext / 1000));
  const detail = `Too many wrong API keys from this address; try again in ${seconds} s.`;
  return ProblemException.of(
    429,
    'too-many-failed-authentications',
    'Too Many Failed Authentications',
    detail,
    {},
    {
      'Retry-After': String(seconds),
    },
  );
}

/**
 * `Authorization: Bearer <secret>` against API_KEYS. Every configured secret is compared, in constant time, so timing
 * reveals nothing. Wrong keys are counted per source address (`req.ip`, see TRUST_PROXY_HOPS) in this process's
 * memory: each replica limits on its own, so N replicas allow N times the rate, which is still no brute force.
 * A request with no key at all is not a guess and is not counted.
 */
@Injectable()
export class ApiKeys {
  private readonly clients: { clientId: string; digest: Buffer }[];
  private readonly failures = new RateLimiterMemory({
    points: FAILED_AUTHENTICATIONS_PER_MINUTE,
    duration: 60,
    blockDuration: FAILED_AUTHENTICATION_BLOCK_SECONDS,
  });

  constructor(@Inject(APP_CONFIG) config: AppConfig) {
    this.clients = config.apiClients.map((c) => ({ clientId: c.clientId, digest: secretDigest(c.secret) }));
  }

  /** The client the request's key names; a 401 or 429 ProblemException otherwise. */
  async authenticate(req: Request): Promise<string> {
    const blocked = await this.failures.get(req.ip);
    if (blocked && blocked.consumedPoints > FAILED_AUTHENTICATIONS_PER_MINUTE) throw tooManyFailures(blocked);
    const header = req.headers.authorization;
    if (!header) throw unauthorized(SEND_A_KEY);
    const token = bearerToken(header);
    const presented = token === undefined ? undefined : secretDigest(token);
    let clientId: string | undefined;
    for (const client of this.clients) {
      if (presented && timingSafeEqual(presented, client.digest)) clientId = client.clientId;
    }
    if (clientId) return clientId;
    await this.failures.consume(req.ip).catch((res: unknown) => {
      throw res instanceof RateLimiterRes ? tooManyFailures(res) : res;
    });
    throw unauthorized(token === undefined ? SEND_A_KEY : 'The API key is not valid.');
  }
}
