import { createHash } from 'node:crypto';

/** The token of `Authorization: Bearer <token>`; undefined when the header is absent or says another scheme. */
export function bearerToken(header: string | undefined): string | undefined {
  return header ? /^Bearer\s+(\S+)\s*$/i.exec(header)?.[1] : undefined;
}

/**
 * What a presented secret is compared by: its SHA-256. Digests have equal lengths, so `timingSafeEqual` over them
 * tells neither a secret's content nor its length.
 */
export const secretDigest = (secret: string): Buffer => createHash('sha256').update(secret).digest();

/** A secret a client sends as a bearer token: visible ASCII (a space would end it in the header), 16 to 512 characters. */
export const BEARER_SECRET_FORMAT = /^[\x21-\x7e]{16,512}$/;
