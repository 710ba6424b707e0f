import { Agent, request } from 'node:http';
import { connect } from 'node:net';

/** One request as the kit sent it. Header values may repeat (two Idempotency-Key lines): hence node:http, not fetch, which merges them. */
export interface Sent {
  method: string;
  path: string;
  headers: Record<string, string | string[]>;
  body?: string;
}

export interface Answer {
  status: number;
  /** Lower-case names, as Node gives them. */
  headers: Record<string, string>;
  body: Buffer;
}

/** A request and what came of it: an answer, or the reason there was none (connection refused, reset, timeout). */
export interface Exchange {
  sent: Sent;
  answer?: Answer;
  error?: string;
}

const LOOPBACK = new Set(['localhost', '127.0.0.1', '[::1]', '::1']);

/** The kit fires bursts of duplicates on purpose: only at a service on this machine. */
export function loopbackBase(raw: string): URL {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new Error(`--base ${raw} is not a URL (e.g. http://127.0.0.1:3000)`);
  }
  if (url.protocol !== 'http:') throw new Error(`--base ${raw}: only http:// on loopback is supported`);
  if (!LOOPBACK.has(url.hostname) && !/^127\.\d+\.\d+\.\d+$/.test(url.hostname)) {
    throw new Error(
      `--base ${raw} is not a loopback address: the kit sends bursts of duplicate writes, so it only talks to 127.0.0.1, ::1 or localhost`,
    );
  }
  return url;
}

/** At most `limit` requests in flight at once, whatever a check asks for. */
export class HttpClient {
  private readonly agent: Agent;
  private active = 0;
  private readonly queue: (() => void)[] = [];

  constructor(
    private readonly base: URL,
    private readonly limit: number,
    private readonly timeoutMs: number,
  ) {
    // A connection per request: an API killed and restarted by the crash check leaves no dead socket to reuse.
    this.agent = new Agent({ keepAlive: false, maxSockets: limit });
  }

  /** `onInformation`: called on each 1xx before the answer (a held request saying it reached its window). */
  async send(sent: Sent, onInformation?: (status: number) => void): Promise<Exchange> {
    await this.slot();
    try {
      return await this.exchange(sent, onInformation);
    } finally {
      this.active--;
      this.queue.shift()?.();
    }
  }

  /** Requests sent and not yet answered. */
  get inFlight(): number {
    return this.active;
  }

  close(): void {
    this.agent.destroy();
  }

  private slot(): Promise<void> {
    if (this.active < this.limit) {
      this.active++;
      return Promise.resolve();
    }
    return new Promise((resolve) =>
      this.queue.push(() => {
        this.active++;
        resolve();
      }),
    );
  }

  private exchange(sent: Sent, onInformation?: (status: number) => void): Promise<Exchange> {
    const body = sent.body === undefined ? undefined : Buffer.from(sent.body, 'utf8');
    const headers: Record<string, string | string[]> = { ...sent.headers };
    if (body) headers['Content-Length'] = String(body.length);
    const target = new URL(sent.path, this.base);
    return new Promise((resolve) => {
      const req = request(
        {
          host: this.base.hostname.replace(/^\[|\]$/g, ''),
          port: this.base.port || 80,
          method: sent.method,
          path: target.pathname + target.search,
          headers,
          agent: this.agent,
          timeout: this.timeoutMs,
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (chunk: Buffer) => chunks.push(chunk));
          res.on('error', (err) => resolve({ sent, error: err.message }));
          res.on('end', () => {
            const answerHeaders: Record<string, string> = {};
            for (const [name, value] of Object.entries(res.headers))
              if (value !== undefined) answerHeaders[name] = Array.isArray(value) ? value.join(', ') : value;
            resolve({ sent, answer: { status: res.statusCode ?? 0, headers: answerHeaders, body: Buffer.concat(chunks) } });
          });
        },
      );
      if (onInformation) req.on('information', (info: { statusCode: number }) => onInformation(info.statusCode));
      req.on('timeout', () => req.destroy(new Error(`no answer within ${this.timeoutMs} ms`)));
      req.on('error', (err: NodeJS.ErrnoException) => resolve({ sent, error: err.code ?? err.message }));
      req.end(body);
    });
  }
}

/** The answer's body as JSON, or undefined when it is not JSON. */
export function jsonOf(answer: Answer | undefined): unknown {
  if (!answer || answer.body.length === 0) return undefined;
  try {
    return JSON.parse(answer.body.toString('utf8')) as unknown;
  } catch {
    return undefined;
  }
}

/**
 * Whether anything accepts a TCP connection at the base: 'open', or the reason nothing did (ECONNREFUSED: no
 * process listens). How the kit sees a target down before a run, and a killed API gone.
 */
export function probe(base: URL, timeoutMs = 2_000): Promise<string> {
  return new Promise((resolve) => {
    const socket = connect({ host: base.hostname.replace(/^\[|\]$/g, ''), port: Number(base.port || 80), timeout: timeoutMs });
    socket.once('connect', () => {
      socket.destroy();
      resolve('open');
    });
    socket.once('timeout', () => {
      socket.destroy();
      resolve(`no connection within ${timeoutMs} ms`);
    });
    socket.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
  });
}
