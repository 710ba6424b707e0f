import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { parseEnv } from 'node:util';
import { ConfigError } from '#service-kit';

type Env = Record<string, string | undefined>;

/**
 * Reads `.env` from the working directory into `env`, as a Nest user expects of `@nestjs/config`:
 * call it before `loadConfig()`. A variable already set in the real environment wins (even when set
 * to the empty string: the operator said so); a missing file is no error. Node's own parser
 * (`util.parseEnv`, the one behind `--env-file`), so no dotenv dependency.
 * Returns the names it set, so a caller can say where a value came from.
 */
export function loadEnvFile(path = resolve(process.cwd(), '.env'), env: Env = process.env): string[] {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    // A .env that exists but cannot be read (a folder, no permission) is a mistake worth stopping for.
    throw new ConfigError('.env', `cannot be read (${(err as NodeJS.ErrnoException).code ?? String(err)})`, path);
  }
  const loaded: string[] = [];
  for (const [name, value] of Object.entries(parseEnv(text))) {
    if (env[name] !== undefined) continue;
    env[name] = value;
    loaded.push(name);
  }
  return loaded;
}
