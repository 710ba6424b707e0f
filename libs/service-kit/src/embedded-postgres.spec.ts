import { socketPathFits } from './embedded-postgres.js';

describe('socketPathFits', () => {
  it('takes a data folder whose socket path stays within the kernel limit (107 bytes and the NUL)', () => {
    expect(socketPathFits('/home/dev/idempotent-orders/.data/postgres', 54329)).toBe(true);
    // 107 bytes exactly: "/" + 91 × "a" + "/.s.PGSQL.54329" (15 bytes).
    expect(socketPathFits(`/${'a'.repeat(91)}`, 54329)).toBe(true);
  });

  it('refuses one nested so deep that PostgreSQL could not create its socket (the server then listens on TCP alone)', () => {
    expect(socketPathFits(`/${'a'.repeat(92)}`, 54329)).toBe(false);
    // Bytes, not characters: a non-ASCII folder name counts for what it takes in sun_path.
    expect(socketPathFits(`/${'é'.repeat(46)}`, 54329)).toBe(false);
  });
});
