import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { type ServiceProcess, startServiceProcess } from './support/service-process';
import { ALICE, bearer, createTestDatabase } from './support/test-app';

/**
 * What the service writes per request at the LOG_LEVEL a user starts it with (unset: info), and at debug: the success
 * path costs no line at the default (the bench measures it there), a refusal gets one, naming its request id.
 */
describe('request logging at the levels a user runs', () => {
  const order = (note: string) => ({
    orderNumber: `log-${randomUUID()}`,
    currency: 'EUR',
    items: [{ sku: 'A', quantity: 1, unitPriceMinor: 100 }],
    note,
  });

  async function withService(logLevel: string, run: (service: ServiceProcess) => Promise<void>): Promise<void> {
    const database = await createTestDatabase();
    let service: ServiceProcess | undefined;
    try {
      service = await startServiceProcess({
        DATABASE_URL: database.url,
        API_KEYS: `${ALICE.clientId}:${ALICE.secret}`,
        LOG_LEVEL: logLevel,
      });
      await run(service);
    } finally {
      await service?.kill('SIGKILL');
      await database.drop();
    }
  }

  const post = (url: string, body: object, key = randomUUID()) =>
    request(url).post('/orders').set('Authorization', bearer(ALICE)).set('Idempotency-Key', key).send(body);

  it('at the default level a created and a replayed order write nothing; a refusal writes one line with its request id', async () => {
    await withService('', async (service) => {
      const key = randomUUID();
      const body = order('logged-create');
      const created = await post(service.url, body, key);
      expect(created.status).toBe(201);
      const replayed = await post(service.url, body, key);
      expect(replayed.headers['idempotent-replayed']).toBe('true');
      const refused = await post(service.url, { ...order('logged-refusal'), currency: 'euro' });
      expect(refused.status).toBe(400);
      const ids = [created, replayed, refused].map((res) => String(res.headers['x-request-id']));
      // Lines about these requests; start-up lines, which Nest
      // buffers and may flush late, and the relays' are not about a request.
      const requestLines = () =>
        service
          .output()
          .split('\n')
          .filter((l) => l.startsWith('{'))
          .map((l) => JSON.parse(l) as Record<string, unknown>)
          .filter((l) => ids.some((id) => JSON.stringify(l).includes(id)) || /^idempotency /.test(String(l.msg)));
      // The line reaches us through the child's stdout pipe, which may lag the HTTP answer: poll, with a deadline.
      const deadline = Date.now() + 5_000;
      while (requestLines().length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      const lines = requestLines();
      expect(lines).toEqual([
        expect.objectContaining({ level: 30, requestId: ids[2], type: 'urn:idempotent-orders:problem:validation-failed' }),
      ]);
      expect(lines[0].msg).toMatch(/^400 .+ on POST \/orders$/);
    });
  });

  it('at debug every request gets its line, and the idempotency outcome its own', async () => {
    await withService('debug', async (service) => {
      const before = service.output().length;
      const created = await post(service.url, order('logged-debug'));
      expect(created.status).toBe(201);
      const requestId = String(created.headers['x-request-id']);
      // pino-http writes its line once the response has finished: poll for it, with a deadline.
      const deadline = Date.now() + 5_000;
      const written = () =>
        service
          .output()
          .slice(before)
          .split('\n')
          .filter((l) => l.startsWith('{'))
          .map((l) => JSON.parse(l) as Record<string, unknown>);
      while (
        !written().some((l) => (l.req as { id?: string } | undefined)?.id === requestId && l.res !== undefined) &&
        Date.now() < deadline
      ) {
        await new Promise((r) => setTimeout(r, 20));
      }
      expect(written()).toEqual(
        expect.arrayContaining([
          expect.objectContaining({ req: expect.objectContaining({ id: requestId }), res: { statusCode: 201 } }),
          expect.objectContaining({ msg: expect.stringMatching(/^idempotency executed: client alice, key /) }),
        ]),
      );
    });
  });
});
