import type { LogLevel } from '@nestjs/common';

/** LOG_LEVEL's values: pino's level names, from the most severe, and `silent`. */
export const LOG_LEVEL_NAMES = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export type LogLevelName = (typeof LOG_LEVEL_NAMES)[number];

/** Nest's logger levels each LOG_LEVEL turns on: what `Logger.isLevelEnabled` answers, so no line is built to be dropped. */
export const NEST_LOG_LEVELS: Readonly<Record<LogLevelName, LogLevel[]>> = {
  fatal: ['fatal'],
  error: ['fatal', 'error'],
  warn: ['fatal', 'error', 'warn'],
  info: ['fatal', 'error', 'warn', 'log'],
  debug: ['fatal', 'error', 'warn', 'log', 'debug'],
  trace: ['fatal', 'error', 'warn', 'log', 'debug', 'verbose'],
  silent: [],
};
