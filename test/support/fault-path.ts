import { once } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';

/**
 * What the path does with one request of a scripted key: `lose` never delivers it and never answers (the client's
 * attempt times out); `late` delivers it `delayMs` after it arrived, whether or not the client still waits; `answer`
 * answers it itself with `status`, never delivering it (a gateway, a proxy refusing it).
 */
export type FaultStep = { kind: 'lose' } | { kind: 'late'; delayMs: number } | { kind: 'answer'; status: number };

/**
 * The network between the service and the provider, with the faults a deployment has: the provider away (`down`:
 * every connection is cut before anything is delivered), or, for the next new outbound Idempotency-Key POSTed to a
 * path, a script of what happens to each of its requests in turn (then delivered as they come). Everything else
 * is forwarded at once. Lookups (GET) are cut too while down.
 */
export class FaultPath {
  /** The provider's base, without /psp (set once the provider listens). */
  target = '';
  down = false;
  /** Requests delivered to the provider per path (POST only), for assertions. */
  readonly delivered = new Map<string, number>();
  private readonly scripts = new Map<string, { steps: FaultStep[]; key?: string; sent: number }>();
  private readonly inFlight = new Set<Promise<void>>();
  private readonly server: Server = createServer((req, res) => this.track(this.handle(req, res)));

  async start(): Promise<string> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  /** The requests under the next new Idempotency-Key POSTed to `path` meet `steps`, one each, in order. */
  script(path: '/psp/charges' | '/psp/refunds', steps: FaultStep[]): void {
    this.scripts.set(path, { steps, sent: 0 });
  }

  /** Resolves once every request taken in has been delivered (or lost) and its answer handled. */
  async settled(): Promise<void> {
    while (this.inFlight.size > 0) await Promise.allSettled([...this.inFlight]);
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
    await this.settled();
  }

  private track(work: Promise<void>): void {
    const tracked = work.catch(() => undefined);
    this.inFlight.add(tracked);
    void tracked.finally(() => this.inFlight.delete(tracked));
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (this.down) {
      req.socket.destroy();
      return;
    }
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const path = (req.url ?? '').split('?')[0];
    const key = typeof req.headers['idempotency-key'] === 'string' ? req.headers['idempotency-key'] : undefined;
    const script = req.method === 'POST' && key !== undefined ? this.scripts.get(path) : undefined;
    if (script && key !== undefined && (script.key ?? key) === key) {
      script.key = key;
      const step = script.steps[script.sent++];
      if (step?.kind === 'lose') {
        // Held unanswered until the client gives up (its timeout closes the connection) or the path stops.
        if (!res.destroyed) await once(res, 'close');
        return;
      }
      if (step?.kind === 'answer') {
        res.writeHead(step.status, { 'content-type': 'application/problem+json' });
        res.end(JSON.stringify({ type: 'about:blank', title: 'Refused on the way', status: step.status }));
        return;
      }
      if (step?.kind === 'late') await sleep(step.delayMs);
    }
    if (req.method === 'POST') this.delivered.set(path, (this.delivered.get(path) ?? 0) + 1);
    const headers: Record<string, string> = {};
    for (const name of ['content-type', 'accept', 'idempotency-key', 'authorization'])
      if (typeof req.headers[name] === 'string') headers[name] = req.headers[name];
    const answer = await fetch(this.target + req.url, {
      method: req.method,
      headers,
      body: chunks.length ? Buffer.concat(chunks) : undefined,
    });
    const body = Buffer.from(await answer.arrayBuffer());
    if (res.destroyed) return;
    res.writeHead(answer.status, { 'content-type': answer.headers.get('content-type') ?? 'application/json' });
    res.end(body);
  }
}
