import { isIP } from 'node:net';

/**
 * HOST, as every app here reads it: development binds loopback, so what it serves with published or printed dev
 * secrets stays this machine's; production (a container behind a load balancer) binds every interface. An address,
 * not a name: a banner, and a sandbox's webhooks to itself, must know exactly where the app is. `problem` is said
 * after the variable's name, in each app's own message style.
 */
export function listenHost(raw: string | undefined, production: boolean): { host: string; problem?: string } {
  const host = production ? '0.0.0.0' : '127.0.0.1';
  const value = raw?.trim();
  if (value === undefined || value === '') return { host };
  if (isIP(value) === 0) return { host, problem: 'must be an IP address to listen on (127.0.0.1, 0.0.0.0, ::)' };
  return { host: value };
}

const WILDCARDS = new Set(['0.0.0.0', '::']);
const LOOPBACK = /^(127\.|::1$|::ffff:127\.)/;

/** The host to type into a browser for a bound address: localhost for loopback and for every interface (which include it). */
export const browsableHost = (host: string) =>
  WILDCARDS.has(host) || LOOPBACK.test(host) ? 'localhost' : host.includes(':') ? `[${host}]` : host;

/** Who can reach it: said, because "localhost" alone would not tell a loopback bind from every interface. */
export const boundTo = (host: string) =>
  WILDCARDS.has(host)
    ? `bound to ${host}: every interface, reachable from other machines`
    : LOOPBACK.test(host)
      ? `bound to ${host}: this machine only; HOST=0.0.0.0 to be reachable from others`
      : `bound to ${host} only`;
