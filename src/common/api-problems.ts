import type { SchemaObject } from '@nestjs/swagger';
import type { ProblemExample } from '#service-kit';

/** The JSON Schema of an extension member that names an order. */
export const ORDER_ID_MEMBER: SchemaObject = { type: 'string', format: 'uuid', description: 'The id of the order this problem is about.' };

export const UNAUTHORIZED: ProblemExample = {
  status: 401,
  description: 'Missing or invalid API key.',
  example: { type: 'urn:idempotent-orders:problem:unauthorized', title: 'Unauthorized', status: 401, detail: 'The API key is not valid.' },
};

export const TOO_MANY_FAILED_AUTHENTICATIONS: ProblemExample = {
  status: 429,
  description: 'Too many wrong API keys from this address within a minute: every key from it is refused until Retry-After has passed.',
  headers: { 'Retry-After': { description: 'Seconds until this address may authenticate again.', schema: { type: 'integer' } } },
  example: {
    type: 'urn:idempotent-orders:problem:too-many-failed-authentications',
    title: 'Too Many Failed Authentications',
    status: 429,
    detail: 'Too many wrong API keys from this address; try again in 60 s.',
  },
};

export const ORDER_NOT_FOUND: ProblemExample = {
  status: 404,
  description: 'No such order for this client.',
  example: {
    type: 'urn:idempotent-orders:problem:order-not-found',
    title: 'Order not found',
    status: 404,
    detail: 'There is no order 6f1c2d0e-5b7a-4c3e-9f8d-2a1b0c9d8e7f.',
  },
};
