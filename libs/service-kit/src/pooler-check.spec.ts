import { poolerSuspicion } from './pooler-check.js';

describe('poolerSuspicion', () => {
  it('the server listens on the URL’s port (5432 when it names none): nothing to say', () => {
    expect(poolerSuspicion('postgres://app:pw@db:5433/orders', 5433)).toBeUndefined();
    expect(poolerSuspicion('postgres://app:pw@db/orders', 5432)).toBeUndefined();
  });

  it('a Unix socket (no server port): nothing can be told', () => {
    expect(poolerSuspicion('postgres://app:pw@db/orders', null)).toBeUndefined();
  });

  it('another port answers as the server: a ConfigError naming DATABASE_PREPARED_STATEMENTS and both ports', () => {
    const err = poolerSuspicion('postgres://app:pw@pooler:6543/orders', 5432);
    expect(err?.variable).toBe('DATABASE_PREPARED_STATEMENTS');
    expect(err?.message).toMatch(/6543.*5432/);
  });
});
