import { SetMetadata } from '@nestjs/common';

/** The metadata key an API-key guard reads to let a route through without a key. */
export const PUBLIC_ROUTE = 'publicRoute';
/** Marks a route that needs no API key (health, metrics, webhooks that carry their own signature, the sandbox provider). */
export const Public = () => SetMetadata(PUBLIC_ROUTE, true);
