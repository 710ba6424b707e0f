import { createHmac, timingSafeEqual } from 'node:crypto';

/** How far a delivery's timestamp may be from now, either way: older is a replay, newer a forged clock. */
export const WEBHOOK_TOLERANCE_SECONDS = 5 * 60;
/** Whole seconds since the epoch, nothing else: `1733300000junk` or `1.7e9` is no timestamp. */
const TIMESTAMP = /^[0-9]{1,12}$/;
const SHA256_BYTES = 32;

/** Why a delivery is not the provider's: said in the 401's detail. */
export class WebhookSignatureError extends Error {
  constructor(reason: string) {
    super(reason);
    this.name = 'WebhookSignatureError';
  }
}

/**
 * Standard Webhooks' HMAC-SHA256, verified here over the exact bytes received: `${id}.${timestamp}.` followed by the
 * raw body, never a decoded string (decoding as UTF-8 first maps every invalid byte to U+FFFD, so two bodies that
 * differ in such a byte would verify under one signature). The header may carry several space-separated `v1,<base64>`
 * signatures (the provider's secret rotation): one that matches is enough, each compared in constant time.
 */
export class WebhookSignatureVerifier {
  private readonly key: Buffer;

  constructor(secret: string) {
    this.key = Buffer.from(secret.startsWith('whsec_') ? secret.slice('whsec_'.length) : secret, 'base64');
  }

  /** The delivery's id, once its signature is the provider's; WebhookSignatureError otherwise. */
  verify(rawBody: Buffer, headers: { id: unknown; timestamp: unknown; signature: unknown }, nowMs = Date.now()): string {
    const { id, timestamp, signature } = headers;
    if (typeof id !== 'string' || typeof timestamp !== 'string' || typeof signature !== 'string' || id === '') {
      throw new WebhookSignatureError('Missing required headers');
    }
    if (!TIMESTAMP.test(timestamp)) throw new WebhookSignatureError('Invalid timestamp: whole seconds since the epoch');
    const age = nowMs / 1000 - Number(timestamp);
    if (age > WEBHOOK_TOLERANCE_SECONDS) throw new WebhookSignatureError('Message timestamp too old');
    if (age < -WEBHOOK_TOLERANCE_SECONDS) throw new WebhookSignatureError('Message timestamp too new');
    const expected = createHmac('sha256', this.key).update(`${id}.${timestamp}.`).update(rawBody).digest();
    const matches = signature
      .split(' ')
      .filter((entry) => entry.startsWith('v1,'))
      .map((entry) => Buffer.from(entry.slice('v1,'.length), 'base64'))
      .some((given) => given.length === SHA256_BYTES && timingSafeEqual(given, expected));
    if (!matches) throw new WebhookSignatureError('No matching signature found');
    return id;
  }
}
