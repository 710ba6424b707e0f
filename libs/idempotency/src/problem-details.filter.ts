import { type ArgumentsHost, Catch, type ExceptionFilter, HttpException, Logger } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { plainProblem, PROBLEM_CONTENT_TYPE, problemOf } from './problem-details.js';

/**
 * Writes every error as application/problem+json (RFC 9457), on Express or Fastify: the layer's own
 * problems, any HttpException, and a 500 with no internals for the rest. For an app without a filter
 * of its own; an app that has one renders ProblemDetailsException's `problem` and `headers` there.
 */
@Catch()
export class ProblemDetailsFilter implements ExceptionFilter {
  private readonly logger = new Logger('ProblemDetailsFilter');

  constructor(private readonly adapterHost: HttpAdapterHost) {}

  catch(exception: unknown, host: ArgumentsHost): void {
    const { httpAdapter } = this.adapterHost;
    const res: unknown = host.switchToHttp().getResponse();
    const { problem, headers } = exception instanceof HttpException ? problemOf(exception) : { problem: plainProblem(500), headers: {} };
    if (problem.status >= 500)
      this.logger.error(`unhandled error: ${String(exception)}`, exception instanceof Error ? exception.stack : undefined);
    for (const [name, value] of Object.entries(headers)) httpAdapter.setHeader(res, name, value);
    httpAdapter.setHeader(res, 'Content-Type', `${PROBLEM_CONTENT_TYPE}; charset=utf-8`);
    httpAdapter.reply(res, JSON.stringify(problem), problem.status);
  }
}
