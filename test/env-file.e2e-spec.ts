/**
 * `cp .env.example .env && npm start`: the built service reads `.env` from its working directory
 * before it validates the config, and a variable of the real environment wins over the file.
 * Every case here is refused at start-up, so no database is started.
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runServiceToExit } from './support/service-process';

describe('the service process reads ./.env', () => {
  let dir: string;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'idempotent-orders-env-file-'));
    await writeFile(join(dir, '.env'), '# as a user would write it\nPORT=abc\nSUBMIT_TOKEN_TTL_SECONDS=soon\n');
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('bad values in .env stop start-up with one message naming every variable', async () => {
    const { code, output } = await runServiceToExit({}, { cwd: dir });
    expect(code).toBe(1);
    expect(output.trim().split('\n')).toEqual([
      'Invalid configuration (2 variables):',
      '  PORT must be a whole number from 0 to 65535 (got "abc")',
      '  SUBMIT_TOKEN_TTL_SECONDS must be a whole number from 1 to 86400 (got "soon")',
    ]);
  });

  it('the real environment wins over .env (so the next bad value of the file is the one named)', async () => {
    const { code, output } = await runServiceToExit({ PORT: '0' }, { cwd: dir });
    expect(code).toBe(1);
    expect(output).not.toContain('PORT');
    expect(output).toContain('Invalid configuration: SUBMIT_TOKEN_TTL_SECONDS');
  });
});
