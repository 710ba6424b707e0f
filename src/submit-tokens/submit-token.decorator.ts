import { applyDecorators } from '@nestjs/common';
import { ApiHeader } from '@nestjs/swagger';
import { ORDER_ID_MEMBER } from '../common/api-problems.js';
import {
  idempotencyKeyOrSubmitTokenMissing,
  submitTokenInvalid,
  submitTokenUsed,
  submitTokenWithIdempotencyKey,
} from './submit-token-problems.js';
import { SUBMIT_TOKEN_HEADER } from './submit-tokens.service.js';
import { ApiProblems } from '#service-kit';

/**
 * Documents the Submit-Token header and its outcomes on a route that also takes an Idempotency-Key; the examples are the problems the route
 * sends.
 */
export function ApiSubmitToken() {
  return applyDecorators(
    ApiHeader({
      name: SUBMIT_TOKEN_HEADER,
      required: false,
      description:
        'Instead of Idempotency-Key (send exactly one of the two): a token from POST /submit-tokens. It is consumed in the ' +
        'transaction that creates the order, so it creates at most one: a reuse is a 409 naming that order. Unknown, expired ' +
        "or another client's → 422. A request that fails (400, a 409 on the order number, 5xx) consumes nothing.",
      // No example: Swagger UI's Try it out pre-fills examples, and sending both headers is a 400.
      schema: { type: 'string', pattern: '^[A-Za-z0-9_-]{43}$' },
    }),
    ApiProblems(
      {
        status: 400,
        description: 'Both Idempotency-Key and Submit-Token were sent: send exactly one.',
        example: submitTokenWithIdempotencyKey().problem,
      },
      {
        status: 400,
        description: 'Neither Idempotency-Key nor Submit-Token was sent.',
        example: idempotencyKeyOrSubmitTokenMissing().problem,
      },
      {
        status: 409,
        description: 'The Submit-Token was already used: orderId names the order it created. Nothing new was created.',
        example: submitTokenUsed('3b7e0c52-8f3e-4c1a-9a53-1f0d2b6e7a91').problem,
        members: {
          orderId: {
            ...ORDER_ID_MEMBER,
            nullable: true,
            description: 'The order this token created (null only if that order was deleted since).',
          },
        },
      },
      {
        status: 422,
        description: "The Submit-Token is unknown, expired or another client's. Nothing was created, nothing consumed.",
        example: submitTokenInvalid().problem,
      },
    ),
  );
}
