import type { LoggerService } from '@nestjs/common';

/** Nest's own start-up narration: one line per module and per route, ~50 in all. */
const START_UP_CONTEXTS = new Set(['NestFactory', 'InstanceLoader', 'RoutesResolver', 'RouterExplorer', 'NestApplication']);

/**
 * The app's logger, with Nest's start-up narration moved to debug: at info, it would push the start-up banner
 * (Swagger UI's URL, the dev API key) off the first screen. LOG_LEVEL=debug shows it again.
 */
export class QuietStartupLogger implements LoggerService {
  constructor(private readonly logger: LoggerService) {}

  log(message: unknown, ...rest: unknown[]): void {
    const context = rest.at(-1);
    if (typeof context === 'string' && START_UP_CONTEXTS.has(context)) this.logger.debug?.(message, ...rest);
    else this.logger.log(message, ...rest);
  }

  error(message: unknown, ...rest: unknown[]): void {
    this.logger.error(message, ...rest);
  }

  warn(message: unknown, ...rest: unknown[]): void {
    this.logger.warn(message, ...rest);
  }

  debug(message: unknown, ...rest: unknown[]): void {
    this.logger.debug?.(message, ...rest);
  }

  verbose(message: unknown, ...rest: unknown[]): void {
    this.logger.verbose?.(message, ...rest);
  }

  fatal(message: unknown, ...rest: unknown[]): void {
    (this.logger.fatal ?? this.logger.error).call(this.logger, message, ...rest);
  }
}
