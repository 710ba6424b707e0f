import eslint from '@eslint/js';
import stylistic from '@stylistic/eslint-plugin';
import { dirname, relative, resolve, sep } from 'node:path';
import tseslint from 'typescript-eslint';

const ENTRY_ONLY = 'import the lib through its entry (`#<lib name>`, package.json "imports"), not its files';
/** '../libs/idempotency/src/database', 'libs/idempotency/src': any path into some libs/<name>/src. */
const DEEP_INTO_A_LIB = { regex: '(^|/)libs/[^/]+/src(/|$)', message: ENTRY_ONLY };
/** From src/: '../apps/psp-sandbox/src/x': the service reaches an app it mounts through the app's `#entry` only. */
const DEEP_INTO_AN_APP = {
  regex: '(^|/)apps/[^/]+/',
  message: 'import the app through its entry (`#<app name>`, package.json "imports"), not its files',
};
/**
 * The idempotency package (libs/idempotency, an npm workspace) is used as an adopter uses it: by its name, through its
 * two entries (package.json "exports"), never its files, source or built.
 */
const INTO_THE_IDEMPOTENCY_PACKAGE = {
  regex: '(^|/)libs/idempotency(/|$)|^@idempotent-orders/idempotency/(?!messages$)',
  message:
    'import the idempotency package through its entries only: `@idempotent-orders/idempotency` or `@idempotent-orders/idempotency/messages`',
};
/** From libs/a/src/…: '../../b/src/x' (a climb out of this lib, then into another's src). */
const DEEP_INTO_ANOTHER_LIB = { regex: '^(\\.\\./)+[^./][^/]*/src(/|$)', message: ENTRY_ONLY };

/** libs/<name>/… or apps/<name>/…: the unit a file belongs to, or undefined outside libs/ and apps/. */
function unitOf(file) {
  const [top, name] = relative(import.meta.dirname, file).split(sep);
  return (top === 'libs' || top === 'apps') && name ? `${top}/${name}` : undefined;
}

/**
 * A lib or an app imports only its own files, packages and `#entries`: no relative climb out of its folder (into
 * src/, another lib or app), no absolute path, no bare path naming src/, apps/ or libs/. Resolved against the file,
 * so '../../../src/x.js' is caught at any depth (a path pattern cannot know how deep the importing file sits).
 */
const staysInside = {
  meta: {
    type: 'problem',
    messages: { outside: '{{unit}} must not import {{source}}: reach code outside it through a `#entry` (package.json "imports")' },
  },
  create(context) {
    const unit = unitOf(context.filename);
    if (!unit) return {};
    const root = resolve(import.meta.dirname, unit);
    const check = (node) => {
      const source = node?.type === 'Literal' && typeof node.value === 'string' ? node.value : undefined;
      if (source === undefined) return;
      const local = source.startsWith('.') || source.startsWith('/');
      const outside = local
        ? !`${resolve(dirname(context.filename), source)}${sep}`.startsWith(`${root}${sep}`)
        : /^(src|apps|libs)\//.test(source);
      if (outside) context.report({ node, messageId: 'outside', data: { unit, source } });
    };
    return {
      ImportDeclaration: (node) => check(node.source),
      ExportNamedDeclaration: (node) => check(node.source),
      ExportAllDeclaration: (node) => check(node.source),
      ImportExpression: (node) => check(node.source),
    };
  },
};

export default tseslint.config(
  {
    ignores: [
      'dist/',
      'libs/idempotency/dist/',
      'node_modules/',
      'coverage/',
      '.data/',
      'bench/peer/',
      'conformance/dist/',
      'conformance/node_modules/',
      'jest.config.js',
      'eslint.config.js',
    ],
  },
  eslint.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: { projectService: { allowDefaultProject: [] }, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      // A promise nobody awaits is a write nobody checked: the bugs this project exists to prevent.
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/require-await': 'error',
      '@typescript-eslint/no-misused-promises': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_' }],
    },
  },
  {
    // Prettier lays the code out (`npm run lint` checks it) but leaves comments and strings as written: comments are held to
    // its width here. A long string stays whole: a SQL statement or a message reads better unbroken than concatenated.
    files: ['**/*.ts'],
    ignores: ['test/generated/**'],
    plugins: { '@stylistic': stylistic },
    rules: {
      '@stylistic/max-len': [
        'error',
        { code: 140, ignoreStrings: true, ignoreTemplateLiterals: true, ignoreRegExpLiterals: true, ignoreUrls: true },
      ],
    },
  },
  {
    // A lib's public entry is its `#name` (package.json "imports"); its files are its own business.
    files: ['**/*.ts'],
    ignores: ['libs/**'],
    rules: { 'no-restricted-imports': ['error', { patterns: [DEEP_INTO_A_LIB, INTO_THE_IDEMPOTENCY_PACKAGE] }] },
  },
  {
    files: ['src/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: [DEEP_INTO_A_LIB, DEEP_INTO_AN_APP, INTO_THE_IDEMPOTENCY_PACKAGE] }] },
  },
  {
    // Inside a lib, relative imports among its own files are fine; climbing out into another lib's src is not.
    files: ['libs/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: [DEEP_INTO_A_LIB, DEEP_INTO_ANOTHER_LIB, INTO_THE_IDEMPOTENCY_PACKAGE] }] },
  },
  {
    // Two files alone reach into the idempotency package's source: the tests' handle on internals they drive by hand,
    // and the create bench, which sends the claim's own statements. No app code may (the package exports neither).
    files: ['test/support/idempotency-internals.ts', 'bench/create-sql-ab.ts'],
    rules: { 'no-restricted-imports': 'off' },
  },
  {
    // Libs and apps import nothing outside their own folder but packages and `#entries`: no lib reaches the service
    // (src/) or an app, no app reaches src/ or another app's files (test/lint-boundaries.e2e-spec.ts probes it).
    files: ['libs/**/*.ts', 'apps/**/*.ts'],
    plugins: { boundaries: { rules: { 'stay-inside': staysInside } } },
    rules: { 'boundaries/stay-inside': 'error' },
  },
  {
    // supertest bodies and pg rows are `any` by nature; tests assert on them instead of typing them.
    files: ['test/**/*.ts', 'src/**/*.spec.ts', 'libs/**/*.spec.ts'],
    rules: {
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-argument': 'off',
      '@typescript-eslint/no-unsafe-call': 'off',
      '@typescript-eslint/no-unsafe-return': 'off',
    },
  },
);
