import eslint from '@eslint/js';
import stylistic from '@stylistic/eslint-plugin';
import tseslint from 'typescript-eslint';

const ENTRY_ONLY = 'import the lib through its entry (`#<lib name>`, package.json "imports"), not its files';
/** '../libs/psp-sandbox/src/answer-delays', 'libs/idempotency/src': any path into some libs/<name>/src. */
const DEEP_INTO_A_LIB = { regex: '(^|/)libs/[^/]+/src(/|$)', message: ENTRY_ONLY };
/** From libs/a/src/…: '../../b/src/x' (a climb out of this lib, then into another's src). */
const DEEP_INTO_ANOTHER_LIB = { regex: '^(\\.\\./)+[^./][^/]*/src(/|$)', message: ENTRY_ONLY };

export default tseslint.config(
  { ignores: ['dist/', 'node_modules/', 'coverage/', '.data/', 'bench/peer/', 'conformance/dist/', 'conformance/node_modules/', 'jest.config.js', 'eslint.config.js'] },
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
      '@stylistic/max-len': ['error', { code: 140, ignoreStrings: true, ignoreTemplateLiterals: true, ignoreRegExpLiterals: true, ignoreUrls: true }],
    },
  },
  {
    // A lib's public entry is its `#name` (package.json "imports"); its files are its own business.
    files: ['**/*.ts'],
    ignores: ['libs/**'],
    rules: { 'no-restricted-imports': ['error', { patterns: [DEEP_INTO_A_LIB] }] },
  },
  {
    // Inside a lib, relative imports among its own files are fine; climbing out into another lib's src is not.
    files: ['libs/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: [DEEP_INTO_A_LIB, DEEP_INTO_ANOTHER_LIB] }] },
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
