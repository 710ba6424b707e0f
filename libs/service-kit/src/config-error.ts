/**
 * A bad environment variable: start-up stops with a message that names it (and every other bad one found with it).
 */
export class ConfigError extends Error {
  /** `PORT must be … (got "x")`: this variable's problem alone. */
  readonly problem: string;
  /** Every variable named, in the order checked (several when several are bad). */
  variables: string[];

  constructor(
    readonly variable: string,
    problem: string,
    value: string,
  ) {
    const detail = `${variable} ${problem} (got ${JSON.stringify(value)})`;
    super(`Invalid configuration: ${detail}`);
    this.name = 'ConfigError';
    this.problem = detail;
    this.variables = [variable];
  }

  /** One error for all the problems found: the first one's variable, a message with one line each. */
  static of(errors: ConfigError[]): ConfigError {
    if (errors.length === 1) return errors[0];
    const all = new ConfigError(errors[0].variable, '', '');
    all.message = [`Invalid configuration (${errors.length} variables):`, ...errors.map((e) => `  ${e.problem}`)].join('\n');
    all.variables = errors.map((e) => e.variable);
    return all;
  }
}
