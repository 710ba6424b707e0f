import { parseItem } from 'structured-headers';
import { ProblemDetailsException } from './problem-details.js';

export const IDEMPOTENCY_KEY_HEADER = 'Idempotency-Key';
/** Sent (`true`) with every answer that is a stored one replayed, never with the first. */
export const IDEMPOTENT_REPLAYED_HEADER = 'Idempotent-Replayed';
const MAX_KEY_LENGTH = 255;

/** 1–255 visible ASCII characters (no space), in either form. */
const VISIBLE_ASCII_KEY = /^[\x21-\x7E]{1,255}$/;

/** The `type` of a problem the layer raises, from its slug, when the app names none (IdempotencyModuleOptions.problemType). */
export const defaultProblemType = (slug: string): string => `urn:idempotency:problem:${slug}`;

function malformed(problemType: (slug: string) => string, detail: string): ProblemDetailsException {
  return new ProblemDetailsException({
    type: problemType('idempotency-key-malformed'),
    title: 'Idempotency-Key is malformed',
    status: 400,
    detail,
  });
}

/**
 * The key as the client meant it. The IETF draft makes the header an RFC 8941 string
 * (`"abc"`); most clients send it bare (`abc`, often a UUID). Both forms name the same key.
 * Anything else — empty, too long, control characters, several values, parameters — is a 400,
 * since a key we would have to guess at cannot protect anything. A bare key may not hold a comma:
 * `a,b` is what a proxy makes of two Idempotency-Key headers merged into one; quoted, a comma is
 * part of one string.
 */
export function parseIdempotencyKey(raw: string | string[], problemType: (slug: string) => string = defaultProblemType): string {
  const malformedKey = (detail: string) => malformed(problemType, detail);
  if (Array.isArray(raw)) throw malformedKey('Send exactly one Idempotency-Key header.');
  const value = raw.trim();
  if (value.startsWith('"')) {
    let key: unknown;
    let params: Map<string, unknown>;
    try {
      [key, params] = parseItem(value) as [unknown, Map<string, unknown>];
    } catch {
      throw malformedKey('A quoted Idempotency-Key must be one RFC 8941 string, such as "8e03978e-40d5-43e8-bc93-6894a57f9324".');
    }
    if (typeof key !== 'string' || params.size > 0)
      throw malformedKey('A quoted Idempotency-Key must be a plain RFC 8941 string, without parameters.');
    // An RFC 8941 string may hold spaces; a key may not, quoted or bare.
    if (!VISIBLE_ASCII_KEY.test(key))
      throw malformedKey(`An Idempotency-Key is 1 to ${MAX_KEY_LENGTH} visible ASCII characters, without spaces, quoted or not.`);
    return key;
  }
  if (!VISIBLE_ASCII_KEY.test(value)) {
    throw malformedKey(`An Idempotency-Key is 1 to ${MAX_KEY_LENGTH} visible ASCII characters (a UUID is a good choice).`);
  }
  if (value.includes(',')) {
    throw malformedKey(
      'A bare Idempotency-Key may not contain a comma: it reads as several values (two headers merged into one). Quote it ("a,b") if the comma is part of the key.',
    );
  }
  return value;
}
