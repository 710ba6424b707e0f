/**
 * The lint rule that keeps libs/ and apps/ from reaching outside themselves, probed with ESLint's Node API against
 * the repository's own eslint.config.js: snippets linted as if they were a lib's or an app's file must be refused
 * when they import the service (src/), an app, or another lib's files, and pass for their own files and `#entries`.
 */
import { ESLint } from 'eslint';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, sep } from 'node:path';

// Existing files, so that the type-aware parser (projectService) knows them; lintText lints the snippet in their place.
const LIB_FILE = 'libs/service-kit/src/problem.ts';
const LIB_NESTED_FILE = 'libs/idempotency/src/index.ts';
const APP_FILE = 'apps/psp-sandbox/src/psp-problems.ts';
const SERVICE_FILE = 'src/http-app.ts';
const BOUNDARY_RULES = new Set(['boundaries/stay-inside', 'no-restricted-imports']);

describe('lint: libs/ and apps/ import nothing outside themselves', () => {
  const eslint = new ESLint({ cwd: process.cwd() });

  async function refusals(filePath: string, code: string): Promise<string[]> {
    const [result] = await eslint.lintText(`${code}\nexport const probe = 1;\n`, { filePath });
    return result.messages.filter((m) => m.ruleId !== null && BOUNDARY_RULES.has(m.ruleId)).map((m) => `${m.ruleId}: ${m.message}`);
  }

  it.each([
    [LIB_FILE, "import { problemType } from '../../../src/common/api-problems.js';"],
    [LIB_FILE, "import { x } from '../../../apps/psp-sandbox/src/x.js';"],
    [LIB_FILE, "import { x } from '../../other-lib/src/x.js';"],
    [LIB_FILE, "export { x } from '../../../src/main.js';"],
    [LIB_FILE, "const m = await import('../../../src/main.js');"],
    [LIB_FILE, "import { x } from 'src/config/app-config.js';"],
    [LIB_NESTED_FILE, "import { x } from '../../service-kit/src/problem.js';"],
    [APP_FILE, "import { loadConfig } from '../../../src/config/app-config.js';"],
    [APP_FILE, "import { x } from '../../fulfilment/src/config.js';"],
    [APP_FILE, "import { x } from '../../../libs/service-kit/src/problem.js';"],
    [SERVICE_FILE, "import { x } from '../apps/psp-sandbox/src/psp-sandbox.module.js';"],
    [SERVICE_FILE, "import { x } from '../libs/service-kit/src/problem.js';"],
    // The idempotency package: its two entries only, never its files, built or not.
    [SERVICE_FILE, "import { Database } from '../libs/idempotency/src/database.js';"],
    [SERVICE_FILE, "import { Database } from '../libs/idempotency/dist/database.js';"],
    [SERVICE_FILE, "import { Database } from '@idempotent-orders/idempotency/dist/database.js';"],
    [APP_FILE, "import { resolveOptions } from '@idempotent-orders/idempotency/src/idempotency-options.js';"],
    [LIB_FILE, "import { Database } from '@idempotent-orders/idempotency/dist/database.js';"],
  ])('%s: refuses %s', async (filePath, code) => {
    expect(await refusals(filePath, code)).not.toEqual([]);
  });

  it.each([
    [LIB_FILE, "import { StartupError } from './startup-error.js';"],
    [LIB_FILE, "import { ProblemDetailsException } from '@idempotent-orders/idempotency';"],
    [LIB_FILE, "import { Injectable } from '@nestjs/common';"],
    [APP_FILE, "import { ProblemException } from '#service-kit';"],
    [APP_FILE, "import { pspSandboxMigrations } from '../migrations/index.js';"],
    [APP_FILE, "import { PspCharge } from './dto/psp-charge.view.js';"],
    [SERVICE_FILE, "import { PspSandboxModule } from '#psp-sandbox';"],
    [SERVICE_FILE, "import { Database } from '@idempotent-orders/idempotency';"],
    [APP_FILE, "import { IdempotentMessage } from '@idempotent-orders/idempotency/messages';"],
  ])('%s: allows %s', async (filePath, code) => {
    expect(await refusals(filePath, code)).toEqual([]);
  });

  it('the tree as it is: no file in libs/ or apps/ imports outside its own folder (read directly, as well as linted)', () => {
    const files = ['libs', 'apps'].flatMap((top) =>
      readdirSync(top, { recursive: true, encoding: 'utf8' })
        .filter((f) => f.endsWith('.ts'))
        .map((f) => join(top, f)),
    );
    const outside: string[] = [];
    for (const file of files) {
      const unit = file.split(sep).slice(0, 2).join(sep);
      for (const [, source] of readFileSync(file, 'utf8').matchAll(/(?:from|import\()\s*'([^']+)'/g)) {
        const local = source.startsWith('.') || source.startsWith('/');
        const escapes = local ? !relative(unit, join(dirname(file), source)).match(/^(?!\.\.)/) : /^(src|apps|libs)\//.test(source);
        if (escapes) outside.push(`${file}: ${source}`);
      }
    }
    expect(files.length).toBeGreaterThan(50);
    expect(outside).toEqual([]);
  });
});
