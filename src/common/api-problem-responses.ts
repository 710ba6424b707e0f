import { applyDecorators } from '@nestjs/common';
import { ApiExtraModels, ApiProperty, ApiPropertyOptional, ApiResponse, getSchemaPath } from '@nestjs/swagger';
import { PROBLEM_CONTENT_TYPE } from './problem.js';

/** The RFC 9457 shape every error response has, for the OpenAPI document. */
export class ProblemView {
  @ApiProperty({ example: 'urn:idempotent-orders:problem:validation-failed' })
  type: string;
  @ApiProperty({ example: 'Validation failed' })
  title: string;
  @ApiProperty({ example: 400 })
  status: number;
  @ApiPropertyOptional({ example: 'items.0.quantity must not be greater than 10000' })
  detail?: string;
}

export interface ProblemExample {
  status: number;
  description: string;
  example?: Record<string, unknown>;
  headers?: Record<string, { description: string; schema: { type: string } }>;
}

/** Documents error responses as application/problem+json with an example each. */
export function ApiProblems(...problems: ProblemExample[]) {
  return applyDecorators(
    ApiExtraModels(ProblemView),
    ...problems.map((p) =>
      ApiResponse({
        status: p.status,
        description: p.description,
        headers: p.headers,
        content: {
          [PROBLEM_CONTENT_TYPE]: {
            schema: { $ref: getSchemaPath(ProblemView) },
            ...(p.example ? { example: p.example } : {}),
          },
        },
      }),
    ),
  );
}

export const UNAUTHORIZED: ProblemExample = {
  status: 401,
  description: 'Missing or invalid API key.',
  example: { type: 'urn:idempotent-orders:problem:unauthorized', title: 'Unauthorized', status: 401, detail: 'The API key is not valid.' },
};

export const VALIDATION_FAILED: ProblemExample = {
  status: 400,
  description: 'The request is malformed: invalid JSON, unknown or invalid fields.',
  example: {
    type: 'urn:idempotent-orders:problem:validation-failed',
    title: 'Validation failed',
    status: 400,
    detail: 'items.0.quantity must not be greater than 10000',
    errors: [{ field: 'items.0.quantity', messages: ['quantity must not be greater than 10000'] }],
  },
};

export const ORDER_NOT_FOUND: ProblemExample = {
  status: 404,
  description: 'No such order for this client.',
  example: { type: 'urn:idempotent-orders:problem:order-not-found', title: 'Order not found', status: 404, detail: 'There is no order 6f1c….' },
};
