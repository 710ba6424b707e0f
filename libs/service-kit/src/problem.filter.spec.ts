import { toProblem } from './problem.filter.js';

const withStatus = (message: string, statusCode: number, code?: string) => Object.assign(new Error(message), { statusCode, code });

describe('toProblem', () => {
  it('keeps the 4xx of what Fastify or Node refuse: a body over the limit, a client gone mid-body', () => {
    expect(toProblem(withStatus('Request body is too large', 413, 'FST_ERR_CTP_BODY_TOO_LARGE')).problem).toEqual({
      type: 'about:blank',
      title: 'Payload Too Large',
      status: 413,
      detail: 'Request body is too large',
    });
    // The stream error of a client that hung up mid-body: not a server fault to log as one.
    expect(toProblem(withStatus('aborted', 400, 'ECONNRESET')).problem.status).toBe(400);
  });

  it('answers anything else, a 5xx status included, with a 500 that tells nothing of its cause', () => {
    for (const err of [new Error('boom'), withStatus('upstream said 503', 503), { statusCode: '400' }, null]) {
      const { problem } = toProblem(err);
      expect(problem).toEqual({
        type: 'about:blank',
        title: 'Internal Server Error',
        status: 500,
        detail: expect.not.stringMatching(/boom|upstream/),
      });
    }
  });

  it('answers a statement a schema change invalidated (0A000 cached plan) with 503 + Retry-After, not 500', () => {
    const pgError = { severity: 'ERROR', code: '0A000', message: 'cached plan must not change result type' };
    const { problem, headers } = toProblem(pgError);
    expect(problem).toMatchObject({ type: 'urn:idempotent-orders:problem:schema-changed', status: 503 });
    expect(headers['Retry-After']).toMatch(/^\d+$/);
    // Another feature_not_supported is a bug of ours, not a schema change.
    expect(
      toProblem({ severity: 'ERROR', code: '0A000', message: 'FOR UPDATE is not allowed with aggregate functions' }).problem.status,
    ).toBe(500);
  });
});
