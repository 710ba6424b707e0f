/**
 * The fulfilment consumer's configuration (`npm run start:fulfilment`): validated once at start-up, every bad
 * variable named in one message before anything connects; `.env.example` lists exactly what it reads.
 */
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { FULFILMENT_VARIABLES } from '../apps/fulfilment/src/config';
import { runServiceToExit } from './support/service-process';

const MAIN = resolve(process.cwd(), 'dist/apps/fulfilment/src/main.js');

describe('the fulfilment consumer refuses a bad configuration at start-up', () => {
  it('names every bad or missing variable in one message, and exits 1 without connecting to anything', async () => {
    const { code, output } = await runServiceToExit(
      {
        NODE_ENV: 'prod',
        DATABASE_URL: 'mysql://localhost/orders',
        PORT: 'abc',
        HOST: 'localhost',
        FULFILMENT_API_TOKEN: 'short token',
        FULFILMENT_PREFETCH: '0',
        FULFILMENT_MAX_ATTEMPTS: '21',
        FULFILMENT_MARK_RETENTION_HOURS: '1.5',
        FULFILMENT_BATCH_SIZE: '51',
        FULFILMENT_BATCH_WAIT_MS: '-1',
        DATABASE_POOL_SIZE: 'many',
        LOG_LEVEL: 'loud',
      },
      { main: MAIN },
    );
    expect(code).toBe(1);
    expect(output.trim().split('; ')).toEqual([
      'Invalid configuration: NODE_ENV must be production, development or test (or unset: development), got "prod"',
      'DATABASE_URL must be a postgres: or postgresql: URL, got mysql:',
      'AMQP_URL must be set (e.g. amqp://guest:guest@127.0.0.1:5672)',
      'PORT must be an integer from 0 to 65535, got "abc"',
      'HOST must be an IP address to listen on (127.0.0.1, 0.0.0.0, ::), got "localhost"',
      'FULFILMENT_API_TOKEN must be 16 to 512 visible ASCII characters, no spaces (e.g. openssl rand -hex 16)',
      'FULFILMENT_PREFETCH must be an integer from 1 to 1000, got "0"',
      'FULFILMENT_MAX_ATTEMPTS must be an integer from 1 to 20, got "21"',
      'FULFILMENT_MARK_RETENTION_HOURS must be an integer from 1 to 8760, got "1.5"',
      'FULFILMENT_BATCH_SIZE must be an integer from 1 to 50, got "51"',
      'FULFILMENT_BATCH_WAIT_MS must be an integer from 0 to 1000, got "-1"',
      'DATABASE_POOL_SIZE must be an integer from 1 to 500, got "many"',
      'LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent, got "loud"',
    ]);
  });

  it("AMQP_URL takes a cluster's nodes as a comma-separated list, each checked: a bad one is named", async () => {
    const { code, output } = await runServiceToExit(
      { DATABASE_URL: 'postgres://u:p@127.0.0.1:1/db', AMQP_URL: 'amqp://guest:guest@127.0.0.1:1,http://guest:secret@127.0.0.1:2' },
      { main: MAIN },
    );
    expect(code).toBe(1);
    expect(output.trim()).toBe('Invalid configuration: AMQP_URL must be a amqp: or amqps: URL, got http: (its entry 2)');
  });

  it('one bad value among good ones is named alone', async () => {
    const { code, output } = await runServiceToExit(
      { DATABASE_URL: 'postgres://u:p@127.0.0.1:1/db', AMQP_URL: 'amqp://guest:guest@127.0.0.1:1', FULFILMENT_BATCH_SIZE: 'ten' },
      { main: MAIN },
    );
    expect(code).toBe(1);
    expect(output.trim()).toBe('Invalid configuration: FULFILMENT_BATCH_SIZE must be an integer from 1 to 50, got "ten"');
  });

  it('NODE_ENV=production requires FULFILMENT_API_TOKEN, and a generated one: the token is never printed', async () => {
    const production = {
      NODE_ENV: 'production',
      DATABASE_URL: 'postgres://u:p@127.0.0.1:1/db',
      AMQP_URL: 'amqp://guest:guest@127.0.0.1:1',
    };
    const unset = await runServiceToExit(production, { main: MAIN });
    expect(unset.code).toBe(1);
    expect(unset.output.trim()).toBe(
      'Invalid configuration: FULFILMENT_API_TOKEN must be set when NODE_ENV=production (e.g. openssl rand -hex 16)',
    );
    const handTyped = 'letmein-letmein-letmein-letmein';
    const weak = await runServiceToExit({ ...production, FULFILMENT_API_TOKEN: handTyped }, { main: MAIN });
    expect(weak.code).toBe(1);
    expect(weak.output.trim()).toBe(
      'Invalid configuration: FULFILMENT_API_TOKEN must be generated when NODE_ENV=production: 24 or more characters, 8 or more of them different (e.g. openssl rand -hex 16)',
    );
    expect(weak.output).not.toContain(handTyped);
  });
});

describe('.env.example: the fulfilment consumer section', () => {
  it('lists every variable the consumer reads, and no other', () => {
    const [, section] = readFileSync('.env.example', 'utf8').split('\n# --- The fulfilment consumer');
    const listed = section
      .split('\n')
      .map((line) => /^#?\s*([A-Z][A-Z0-9_]+)=/.exec(line)?.[1])
      .filter((name): name is string => name !== undefined);
    expect(listed.sort()).toEqual([...FULFILMENT_VARIABLES].sort());
  });
});
