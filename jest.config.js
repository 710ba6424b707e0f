/** Jest on Nest 12 (ESM-only): native ESM through --experimental-vm-modules, TypeScript through SWC. */
const swc = [
  '@swc/jest',
  {
    jsc: {
      parser: { syntax: 'typescript', decorators: true },
      transform: { legacyDecorator: true, decoratorMetadata: true },
      target: 'es2022',
    },
    module: { type: 'es6' },
    sourceMaps: 'inline',
  },
];

export default {
  testEnvironment: 'node',
  extensionsToTreatAsEsm: ['.ts'],
  moduleNameMapper: {
    // Sources import './x.js' (Node ESM); Jest resolves the .ts file.
    '^(\\.{1,2}/.*)\\.js$': '$1',
    // package.json "imports": Jest does not read them; each lib's entry, as TypeScript source.
    // The idempotency package (npm workspace) by its name: its entries, as TypeScript source, like the tsconfig's paths.
    '^@idempotent-orders/idempotency$': '<rootDir>/libs/idempotency/src/index.ts',
    '^@idempotent-orders/idempotency/messages$': '<rootDir>/libs/idempotency/src/messages.ts',
    '^#psp-sandbox$': '<rootDir>/apps/psp-sandbox/src/index.ts',
    '^#service-kit$': '<rootDir>/libs/service-kit/src/index.ts',
    '^#service-kit/embedded-postgres$': '<rootDir>/libs/service-kit/src/embedded-postgres.ts',
    '^#outbox-relay$': '<rootDir>/libs/outbox-relay/src/index.ts',
  },
  transform: {
    '^.+\\.ts$': swc,
    // @fastify/static (Swagger UI's assets on Fastify) require()s content-disposition 3, which is ESM-only. Node 20
    // loads that natively (require(esm)); Jest's own module loader does not before Node 24.9, so that one file is
    // compiled to CommonJS for the tests.
    '/node_modules/content-disposition/.+\\.js$': ['@swc/jest', { module: { type: 'commonjs' } }],
  },
  transformIgnorePatterns: ['/node_modules/(?!(?:@fastify/static/node_modules/)?content-disposition/)'],
  testMatch: [
    '<rootDir>/src/**/*.spec.ts',
    '<rootDir>/libs/*/src/**/*.spec.ts',
    '<rootDir>/apps/*/src/**/*.spec.ts',
    '<rootDir>/test/**/*.e2e-spec.ts',
  ],
  // bench/peer is its own package (Nest 10, its own node_modules): never part of this suite.
  modulePathIgnorePatterns: ['<rootDir>/bench/peer/'],
  globalSetup: '<rootDir>/test/support/global-setup.ts',
  globalTeardown: '<rootDir>/test/support/global-teardown.ts',
  // Each e2e file starts an app; a hung test fails instead of stalling CI.
  testTimeout: 60_000,
};
