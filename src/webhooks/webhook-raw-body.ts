import type { IncomingMessage } from 'node:http';

/** Express routes case-insensitively and ignores a trailing slash; so does this. */
const WEBHOOK_ROUTE = /^\/webhooks\/psp\/?(?:\?|$)/i;

/**
 * The body parser's `type` test for the one route whose body must stay the exact bytes sent: the
 * signature is over them, and re-serialised JSON would not match. Every other route is untouched.
 */
export const isWebhookDelivery = (req: IncomingMessage): boolean => WEBHOOK_ROUTE.test(req.url ?? '');
