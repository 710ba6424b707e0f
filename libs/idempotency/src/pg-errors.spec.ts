import { linkSync, renameSync, rmSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client } from 'pg';
import { isContention, isDatabaseUnavailable } from './pg-errors.js';

/** What pg itself raises when it connects to `host`/`port` (a socket folder or an address); the connect must fail. */
async function connectError(host: string, port: number): Promise<unknown> {
  const client = new Client({ host, port, user: 'nobody', database: 'nothing', connectionTimeoutMillis: 2_000 });
  client.on('error', () => undefined);
  try {
    await client.connect();
  } catch (err) {
    return err;
  } finally {
    await client.end().catch(() => undefined);
  }
  throw new Error(`connected to ${host}:${port}`);
}

describe('isDatabaseUnavailable on what pg raises for each transport', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'pg-errors-'));
  });
  afterAll(() => rm(dir, { recursive: true, force: true }));

  it('a Unix socket whose server is down (its socket file is gone): ENOENT from connect', async () => {
    const err = await connectError(dir, 5999);
    expect(err).toMatchObject({ code: 'ENOENT', syscall: 'connect' });
    expect(isDatabaseUnavailable(err)).toBe(true);
  });

  it('a Unix socket file left with nobody listening: ECONNREFUSED', async () => {
    // A server that listened on the socket's path and went away without removing the file (as a kill -9 leaves it).
    const path = join(dir, '.s.PGSQL.5998');
    const stale: Server = createServer();
    await new Promise<void>((listening) => stale.listen(path, listening));
    // Node removes the file when the server closes: keep a second link to put it back.
    const keep = `${path}.keep`;
    linkSync(path, keep);
    await new Promise((closed) => stale.close(closed));
    renameSync(keep, path);
    const err = await connectError(dir, 5998);
    rmSync(path, { force: true });
    expect(err).toMatchObject({ code: 'ECONNREFUSED' });
    expect(isDatabaseUnavailable(err)).toBe(true);
  });

  it('TCP with nobody listening: ECONNREFUSED', async () => {
    const probe = createServer();
    const port = await new Promise<number>((bound) =>
      probe.listen(0, '127.0.0.1', () => bound((probe.address() as { port: number }).port)),
    );
    await new Promise((closed) => probe.close(closed));
    const err = await connectError('127.0.0.1', port);
    expect(err).toMatchObject({ code: 'ECONNREFUSED' });
    expect(isDatabaseUnavailable(err)).toBe(true);
  });

  it('an ENOENT that is not a connect (a missing file) is not an outage', () => {
    const err = Object.assign(new Error('ENOENT: no such file or directory'), { code: 'ENOENT', syscall: 'open', path: '/x' });
    expect(isDatabaseUnavailable(err)).toBe(false);
  });
});

describe('which server errors are an outage and which are contention', () => {
  // As pg raises them: a DatabaseError with the server's severity and SQLSTATE.
  const serverError = (code: string, severity = 'FATAL') => Object.assign(new Error(`server says ${code}`), { code, severity });

  it.each([
    ['53300', 'too many connections (max_connections or a CONNECTION LIMIT)'],
    ['53100', 'disk full'],
    ['28P01', 'password refused'],
    ['28000', 'refused by pg_hba.conf'],
    ['3D000', 'database does not exist'],
    ['57P01', 'server shutting down'],
  ])('%s (%s): the database unavailable, nothing about the work', (code) => {
    expect(isDatabaseUnavailable(serverError(code))).toBe(true);
    expect(isContention(serverError(code, 'ERROR'))).toBe(false);
  });

  it.each([
    ['55P03', 'lock timeout'],
    ['40P01', 'deadlock'],
    ['40001', 'serialization failure'],
    ['57014', 'statement cancelled (statement_timeout or pg_cancel_backend)'],
  ])('%s (%s): contention, which the work itself may cause every time', (code) => {
    expect(isContention(serverError(code, 'ERROR'))).toBe(true);
    expect(isDatabaseUnavailable(serverError(code, 'ERROR'))).toBe(false);
  });

  it('a unique violation is neither', () => {
    expect(isDatabaseUnavailable(serverError('23505', 'ERROR'))).toBe(false);
    expect(isContention(serverError('23505', 'ERROR'))).toBe(false);
  });
});

describe('isDatabaseUnavailable during a failover', () => {
  it('a write on a primary demoted under it (25006 read_only_sql_transaction): the next connection finds the new primary', () => {
    const err = Object.assign(new Error('cannot execute INSERT in a read-only transaction'), { code: '25006', severity: 'ERROR' });
    expect(isDatabaseUnavailable(err)).toBe(true);
  });
});
