import { applyDecorators } from '@nestjs/common';
import { ApiExtraModels, ApiProperty, ApiPropertyOptional, ApiResponse, DECORATORS, getSchemaPath } from '@nestjs/swagger';
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

type ExampleObject = { summary?: string; value: unknown };
interface ProblemContent {
  example?: Record<string, unknown>;
  examples?: Record<string, ExampleObject>;
}

/** A named example, keyed by its problem type's slug, so each type a status can carry shows once in Swagger UI. */
function namedExample(example: Record<string, unknown>): [string, ExampleObject] {
  const slug = typeof example.type === 'string' ? example.type.split(':').pop()! : String(example.status);
  return [slug, { summary: typeof example.title === 'string' ? example.title : slug, value: example }];
}

/**
 * One status, as a decorator that keeps the examples an earlier one documented for it (say
 * @Idempotent's 409 beside a route's own): @nestjs/swagger merges descriptions but replaces content.
 */
function problemResponse(p: ProblemExample): MethodDecorator & ClassDecorator {
  return (target: object, key?: string | symbol, descriptor?: PropertyDescriptor) => {
    const holder: object = descriptor ? (descriptor.value as object) : target;
    const responses = Reflect.getMetadata(DECORATORS.API_RESPONSE, holder) as
      | Record<string, { content?: Record<string, ProblemContent>; headers?: ProblemExample['headers'] }>
      | undefined;
    const earlier = responses?.[p.status]?.content?.[PROBLEM_CONTENT_TYPE];
    const headers = { ...responses?.[p.status]?.headers, ...p.headers };
    const examples: Record<string, ExampleObject> = {
      ...earlier?.examples,
      ...(earlier?.example ? Object.fromEntries([namedExample(earlier.example)]) : {}),
      ...(p.example ? Object.fromEntries([namedExample(p.example)]) : {}),
    };
    const names = Object.keys(examples);
    const content: ProblemContent = names.length > 1 ? { examples } : names.length === 1 ? { example: examples[names[0]].value as Record<string, unknown> } : {};
    const decorator = ApiResponse({
      status: p.status,
      description: p.description,
      ...(Object.keys(headers).length ? { headers } : {}),
      content: { [PROBLEM_CONTENT_TYPE]: { schema: { $ref: getSchemaPath(ProblemView) }, ...content } },
    }) as (target: object, key?: string | symbol, descriptor?: PropertyDescriptor) => unknown;
    return decorator(target, key, descriptor) as never;
  };
}

/** Documents error responses as application/problem+json with an example each; several types on one status show as named examples. */
export function ApiProblems(...problems: ProblemExample[]) {
  return applyDecorators(ApiExtraModels(ProblemView), ...problems.map(problemResponse));
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
