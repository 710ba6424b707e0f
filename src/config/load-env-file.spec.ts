import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadEnvFile } from './load-env-file.js';
import { ConfigError } from '#service-kit';

describe('loadEnvFile', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'load-env-file-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('sets the variables of the file that the real environment does not have; the real environment wins', () => {
    const file = join(dir, '.env');
    writeFileSync(
      file,
      ['# a comment', 'PORT=4000', 'LOG_LEVEL=debug', 'API_KEYS="shop:from-the-file-0123456789"', 'EMPTY_IN_REAL=from-file', ''].join('\n'),
    );
    const env: Record<string, string | undefined> = { PORT: '5000', EMPTY_IN_REAL: '' };

    const loaded = loadEnvFile(file, env);

    expect(env).toEqual({ PORT: '5000', LOG_LEVEL: 'debug', API_KEYS: 'shop:from-the-file-0123456789', EMPTY_IN_REAL: '' });
    expect(loaded.sort()).toEqual(['API_KEYS', 'LOG_LEVEL']);
  });

  it('reads process.env and ./.env by default', () => {
    const file = join(dir, '.env');
    writeFileSync(file, 'LOAD_ENV_FILE_SPEC_A=file\nLOAD_ENV_FILE_SPEC_B=file\n');
    process.env.LOAD_ENV_FILE_SPEC_A = 'real';
    const cwd = process.cwd();
    try {
      process.chdir(dir);
      expect(loadEnvFile()).toEqual(['LOAD_ENV_FILE_SPEC_B']);
      expect(process.env.LOAD_ENV_FILE_SPEC_A).toBe('real');
      expect(process.env.LOAD_ENV_FILE_SPEC_B).toBe('file');
    } finally {
      process.chdir(cwd);
      delete process.env.LOAD_ENV_FILE_SPEC_A;
      delete process.env.LOAD_ENV_FILE_SPEC_B;
    }
  });

  it('a missing file is no error and changes nothing', () => {
    const env = { PORT: '5000' };
    expect(loadEnvFile(join(dir, '.env'), env)).toEqual([]);
    expect(env).toEqual({ PORT: '5000' });
  });

  it('a .env that exists but cannot be read stops start-up with a ConfigError naming .env', () => {
    mkdirSync(join(dir, '.env'));
    let thrown: unknown;
    try {
      loadEnvFile(join(dir, '.env'), {});
    } catch (err) {
      thrown = err;
    }
    expect(thrown).toBeInstanceOf(ConfigError);
    expect((thrown as ConfigError).message).toContain('.env cannot be read (EISDIR)');
  });
});
