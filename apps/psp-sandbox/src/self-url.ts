import type { AddressInfo } from 'node:net';

/**
 * How this process calls its own HTTP server (the in-process sandbox and its webhooks): the bound address itself,
 * or loopback when it listens on every interface (HOST=0.0.0.0 or ::).
 */
export function selfUrl(address: AddressInfo): string {
  const host = address.address === '0.0.0.0' || address.address === '::' ? '127.0.0.1' : address.address;
  return `http://${host.includes(':') ? `[${host}]` : host}:${address.port}`;
}
