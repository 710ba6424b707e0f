/**
 * Secrets a person typed rather than generated: refused in production. 24 characters of a generator (openssl rand
 * -hex 16 gives 32) carry 96 bits or more, and 24 random characters have 8 different ones with a probability of
 * 1 - 1e-5 even from hex; "aaaa…" or "abab…" have 1 or 2.
 */
export const MIN_PRODUCTION_SECRET_LENGTH = 24;
export const MIN_DISTINCT_CHARACTERS = 8;

export const looksHandTyped = (secret: string): boolean =>
  secret.length < MIN_PRODUCTION_SECRET_LENGTH || new Set(secret).size < MIN_DISTINCT_CHARACTERS;
