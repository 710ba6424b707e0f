import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';

/** A request the path held back, and what became of it once it reached the provider. */
export interface HeldRequest {
  path: string;
  idempotencyKey: string;
  /** Whether the client was still waiting when the provider's answer came back. */
  clientWaited?: boolean;
  status?: number;
}

/**
 * The slow path between the service and the provider that real deployments have (a queue in a load
 * balancer, a retrying proxy): an HTTP proxy that forwards everything at once, except the requests of
 * the first outbound Idempotency-Key it sees on a chosen path, which it delivers `delayMs` after each
 * arrived — whether or not the client is still waiting for them. The provider then acts on them late.
 */
export class LatePath {
  /** The provider's base, without /psp (set once the provider listens). */
  target = '';
  readonly held: HeldRequest[] = [];
  private readonly rules = new Map<string, { delayMs: number; choose: (n: number) => boolean; seen: Map<string, boolean> }>();
  private readonly inFlight = new Set<Promise<void>>();
  private readonly server: Server = createServer((req, res) => this.track(this.forward(req, res)));

  async start(): Promise<string> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  /** From now on, the requests under the next new Idempotency-Key sent to `path` arrive `delayMs` late. */
  delayFirstKey(path: '/psp/charges' | '/psp/refunds', delayMs: number): void {
    this.delayKeys(path, delayMs, (n) => n === 0);
  }

  /** From now on, every request under the n-th new Idempotency-Key sent to `path` arrives `delayMs` late when `choose(n)`. */
  delayKeys(path: '/psp/charges' | '/psp/refunds', delayMs: number, choose: (n: number) => boolean): void {
    this.rules.set(path, { delayMs, choose, seen: new Map() });
  }

  /** Resolves once every held request has reached the provider and been answered there. */
  async landed(): Promise<void> {
    while (this.inFlight.size > 0) await Promise.allSettled([...this.inFlight]);
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
    await this.landed();
  }

  private track(work: Promise<void>): void {
    const tracked = work.catch(() => undefined);
    this.inFlight.add(tracked);
    void tracked.finally(() => this.inFlight.delete(tracked));
  }

  private async forward(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const key = typeof req.headers['idempotency-key'] === 'string' ? req.headers['idempotency-key'] : undefined;
    const path = (req.url ?? '').split('?')[0];
    let held: HeldRequest | undefined;
    const rule = req.method === 'POST' && key !== undefined ? this.rules.get(path) : undefined;
    if (rule && key !== undefined) {
      if (!rule.seen.has(key)) rule.seen.set(key, rule.choose(rule.seen.size));
      if (rule.seen.get(key)) {
        held = { path, idempotencyKey: key };
        this.held.push(held);
        // The fault under test: the request is on its way, and reaches the provider this much later.
        await sleep(rule.delayMs);
      }
    }
    const headers: Record<string, string> = {};
    for (const name of ['content-type', 'accept', 'idempotency-key', 'authorization'])
      if (typeof req.headers[name] === 'string') headers[name] = req.headers[name];
    const answer = await fetch(this.target + req.url, {
      method: req.method,
      headers,
      body: chunks.length ? Buffer.concat(chunks) : undefined,
    });
    const body = Buffer.from(await answer.arrayBuffer());
    if (held) {
      held.status = answer.status;
      held.clientWaited = !res.destroyed && !req.socket.destroyed;
    }
    if (res.destroyed) return;
    res.writeHead(answer.status, { 'content-type': answer.headers.get('content-type') ?? 'application/json' });
    res.end(body);
  }
}
