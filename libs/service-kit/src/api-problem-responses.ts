import { applyDecorators } from '@nestjs/common';
import { ApiResponse, DECORATORS, type OpenAPIObject, type ReferenceObject, type SchemaObject } from '@nestjs/swagger';
import { PROBLEM_CONTENT_TYPE } from './problem.js';

/**
 * The OpenAPI side of RFC 9457: one named schema per problem type (`InvalidTransitionProblem`, …):
 * the standard members, `type` pinned to its URN, and the extension members that type carries.
 * A response lists the types it can send (`oneOf`), so a generated client gets a union it can
 * narrow by `type`, and reading `currentStatus` off an invalid-transition is typed.
 *
 * To document a new problem, pass a ProblemExample to @ApiProblems with its `example` and, when it
 * has members beyond type/title/status/detail, their JSON Schema in `members`. Its schema is
 * derived from that; the OpenAPI lint test (test/openapi.e2e-spec.ts) fails when the example and the
 * schema disagree (a member used but not declared, a value of the wrong type).
 */

export const PROBLEM_SCHEMA = 'Problem';

/** The members every problem has; also the schema of a documented problem response without an example. */
const problemSchema: SchemaObject = {
  type: 'object',
  description:
    'RFC 9457 problem details, sent as application/problem+json. `type` is a stable URN to switch on; each type has its own ' +
    'schema (…Problem) with the extension members it carries. Ignore members you do not know.',
  required: ['type', 'title', 'status'],
  properties: {
    // No examples here: every problem type's schema copies these, and its own response examples show real values.
    type: { type: 'string', description: 'A URN naming the problem type, or about:blank when the HTTP status says it all.' },
    title: { type: 'string', description: 'A short summary for people; the same for every occurrence of the type.' },
    status: { type: 'integer', minimum: 400, maximum: 599, description: 'The HTTP status code.' },
    detail: { type: 'string', description: 'What went wrong this time, for people.' },
  },
};

export interface ProblemExample {
  status: number;
  description: string;
  /** A problem this route really sends. Without one, the response is documented as a plain Problem. */
  example?: Record<string, unknown>;
  /** JSON Schema of each extension member the example's problem type carries (beyond type, title, status, detail). */
  members?: Record<string, SchemaObject>;
  /** Members that are sometimes absent; every other member is always sent. */
  optionalMembers?: string[];
  headers?: Record<string, { description: string; schema: { type: string } }>;
}

/** Per problem type, its schema: filled as decorators are applied, read by buildOpenApiDocument. */
const problemTypeSchemas = new Map<string, SchemaObject>();
/** Whether a response without an example uses the plain Problem schema (else it is left out: unused components are a lint warning). */
let plainProblemUsed = false;

/** `urn:idempotent-orders:problem:invalid-transition` → `InvalidTransitionProblem`; about:blank → `HttpStatusProblem`. */
function schemaNameOf(type: string): string {
  if (type === 'about:blank') return 'HttpStatusProblem';
  const slug = type.split(':').pop()!;
  return `${slug.replace(/(^|-)([a-z0-9])/g, (_m, _dash, c: string) => c.toUpperCase())}Problem`;
}

/** Registers the schema of the example's problem type and returns its name; one type must have one shape wherever it is documented. */
function registerProblemType(p: ProblemExample): string {
  if (!p.example) {
    plainProblemUsed = true;
    return PROBLEM_SCHEMA;
  }
  const type = p.example.type;
  if (typeof type !== 'string') throw new Error(`A problem example for status ${p.status} has no string type`);
  const members = p.members ?? {};
  // Flat rather than allOf [Problem, members]: Redocly checks examples for undeclared members only
  // in a schema that lists its properties itself, and that check is what keeps examples and schemas honest.
  const schema: SchemaObject = {
    type: 'object',
    description:
      type === 'about:blank'
        ? 'A problem that the HTTP status code describes entirely (RFC 9457 §4.2.1).'
        : `The problem of type ${type}${typeof p.example.title === 'string' ? ` (${p.example.title})` : ''}.`,
    required: [...problemSchema.required!, ...Object.keys(members).filter((m) => !p.optionalMembers?.includes(m))],
    properties: { ...problemSchema.properties, type: { type: 'string', enum: [type], description: 'This problem type.' }, ...members },
  };
  const name = schemaNameOf(type);
  const earlier = problemTypeSchemas.get(name);
  if (earlier && JSON.stringify(earlier) !== JSON.stringify(schema)) {
    throw new Error(`Problem type ${type} is documented with two different sets of members: give it one (see api-problem-responses.ts)`);
  }
  problemTypeSchemas.set(name, schema);
  return name;
}

/** The schemas of every problem type some route documents (and the plain Problem if one uses it), for the document's components. */
export function problemSchemas(): Record<string, SchemaObject> {
  return { ...(plainProblemUsed ? { [PROBLEM_SCHEMA]: problemSchema } : {}), ...Object.fromEntries(problemTypeSchemas) };
}

type ExampleObject = { summary?: string; value: unknown };
interface ProblemContent {
  schema?: SchemaObject | ReferenceObject;
  example?: Record<string, unknown>;
  examples?: Record<string, ExampleObject>;
}

/** A named example, keyed by its problem type's slug, so each type a status can carry shows once in Swagger UI. */
function namedExample(example: Record<string, unknown>): [string, ExampleObject] {
  const slug = typeof example.type === 'string' ? example.type.split(':').pop()! : String(example.status);
  return [slug, { summary: typeof example.title === 'string' ? example.title : slug, value: example }];
}

const schemaRef = (name: string) => `#/components/schemas/${name}`;

/** The schema names an earlier decorator put on this status's content. */
function schemaNamesIn(schema: ProblemContent['schema']): string[] {
  if (!schema) return [];
  if ('$ref' in schema) return [schema.$ref.split('/').pop()!];
  return (schema.oneOf ?? []).flatMap((s) => ('$ref' in s ? [s.$ref.split('/').pop()!] : []));
}

/**
 * One status, as a decorator that keeps the examples and problem types an earlier one documented for
 * it (say @Idempotent's 409 beside a route's own): @nestjs/swagger merges descriptions but replaces content.
 */
function problemResponse(p: ProblemExample): MethodDecorator & ClassDecorator {
  return (target: object, key?: string | symbol, descriptor?: PropertyDescriptor) => {
    const holder: object = descriptor ? (descriptor.value as object) : target;
    const responses = Reflect.getMetadata(DECORATORS.API_RESPONSE, holder) as Record<string, DocumentedResponse> | undefined;
    const { headers, content } = mergeProblem(responses?.[p.status], p);
    const decorator = ApiResponse({
      status: p.status,
      description: p.description,
      ...(headers ? { headers } : {}),
      content,
    }) as (target: object, key?: string | symbol, descriptor?: PropertyDescriptor) => unknown;
    return decorator(target, key, descriptor) as never;
  };
}

interface DocumentedResponse {
  description?: string;
  content?: Record<string, ProblemContent>;
  headers?: ProblemExample['headers'];
}

/** A status's problem content with `p` added beside the types, examples and headers documented for it already. */
function mergeProblem(
  earlierResponse: DocumentedResponse | undefined,
  p: ProblemExample,
): Required<Pick<DocumentedResponse, 'content'>> & DocumentedResponse {
  const earlier = earlierResponse?.content?.[PROBLEM_CONTENT_TYPE];
  const headers = { ...earlierResponse?.headers, ...p.headers };
  const examples: Record<string, ExampleObject> = {
    ...earlier?.examples,
    ...(earlier?.example ? Object.fromEntries([namedExample(earlier.example)]) : {}),
    ...(p.example ? Object.fromEntries([namedExample(p.example)]) : {}),
  };
  const names = Object.keys(examples);
  const content: ProblemContent =
    names.length > 1 ? { examples } : names.length === 1 ? { example: examples[names[0]].value as Record<string, unknown> } : {};
  // The problem types this status can carry: one is its schema, several are a union told apart by `type`.
  const types = [...new Set([...schemaNamesIn(earlier?.schema), registerProblemType(p)])];
  const schema = types.length === 1 ? { $ref: schemaRef(types[0]) } : { oneOf: types.map((name) => ({ $ref: schemaRef(name) })) };
  return {
    ...(Object.keys(headers).length ? { headers } : {}),
    content: { [PROBLEM_CONTENT_TYPE]: { schema, ...content } },
  };
}

/**
 * The refusals of the body parsing in front of every route (http-app.ts), whatever the route: a
 * client can send a body to any of them, even a GET, and gets one of these before the route runs.
 */
export const REQUEST_BODY_PROBLEMS: ProblemExample[] = [
  {
    status: 400,
    description: 'The body is not valid JSON.',
    example: { type: 'about:blank', title: 'Bad Request', status: 400, detail: 'Unexpected end of JSON input' },
  },
  {
    status: 400,
    description:
      'The JSON body is nested too deeply, or a string in it holds a NUL character or an unpaired surrogate (PostgreSQL cannot store either).',
    example: {
      type: 'urn:idempotent-orders:problem:invalid-json-body',
      title: 'JSON body not accepted',
      status: 400,
      detail: 'The JSON body is nested deeper than 32 levels.',
    },
  },
  {
    status: 415,
    description: 'A JSON body in a charset other than UTF-8 (the JSON parser reads no other).',
    example: { type: 'about:blank', title: 'Unsupported Media Type', status: 415, detail: 'unsupported charset "LATIN1"' },
  },
  {
    status: 413,
    description: 'The body is larger than the limit (64 KiB).',
    example: { type: 'about:blank', title: 'Payload Too Large', status: 413, detail: 'Request body is too large' },
  },
];

/**
 * The router's refusal of a path parameter over 100 characters (Fastify's maxParamLength), before any route runs:
 * only operations whose path has a parameter can meet it.
 */
export const PATH_PARAMETER_TOO_LONG: ProblemExample = {
  status: 414,
  description: 'A path parameter is longer than 100 characters.',
  example: { type: 'about:blank', title: 'URI Too Long', status: 414, detail: "'/orders/xxxxxxxx…' is exceeding the max param length" },
};

/**
 * Adds `problems` to every operation of a built document (with `pathsWithParameters`, to those whose path has a
 * parameter), merged with what its decorators say: for refusals that come from the HTTP layer (http-app.ts) rather
 * than from any one controller.
 */
export function documentOnEveryOperation(
  document: OpenAPIObject,
  problems: ProblemExample[],
  { pathsWithParameters = false }: { pathsWithParameters?: boolean } = {},
): void {
  for (const [path, item] of Object.entries(document.paths)) {
    if (pathsWithParameters && !path.includes('{')) continue;
    for (const method of ['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace'] as const) {
      const operation = item[method];
      if (!operation) continue;
      for (const p of problems) {
        const earlier = operation.responses[p.status] as DocumentedResponse | undefined;
        const description = earlier?.description?.split('\n\n').includes(p.description)
          ? earlier.description
          : [earlier?.description, p.description].filter(Boolean).join('\n\n');
        operation.responses[p.status] = { ...earlier, description, ...mergeProblem(earlier, p) };
      }
    }
  }
}

/** Documents error responses as application/problem+json with an example each; several types on one status show as named examples. */
export function ApiProblems(...problems: ProblemExample[]) {
  return applyDecorators(...problems.map(problemResponse));
}

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
  members: {
    errors: {
      type: 'array',
      description: 'Each invalid field (a dotted path into the body or query) and what is wrong with it.',
      items: {
        type: 'object',
        required: ['field', 'messages'],
        properties: { field: { type: 'string', example: 'items.0.quantity' }, messages: { type: 'array', items: { type: 'string' } } },
      },
    },
  },
};

/** Any route: a request body that is not JSON is refused before anything runs (http-rules.ts). */
export const UNSUPPORTED_MEDIA_TYPE: ProblemExample = {
  status: 415,
  description: 'A request body was sent that is not application/json.',
  example: {
    type: 'urn:idempotent-orders:problem:unsupported-media-type',
    title: 'Unsupported Media Type',
    status: 415,
    detail: 'Send the request body as application/json.',
  },
};
