import type { AddressInfo } from 'node:net';
import { NestFactory } from '@nestjs/core';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { boundTo, browsableHost } from '#service-kit';
import type { FulfilmentConfig } from './config.js';
import { FulfilmentModule } from './fulfilment.module.js';

/** The Nest app main.ts starts (the tests build theirs here too, so both serve HTTP the same way). */
export function createFulfilmentApp(config: FulfilmentConfig): Promise<NestFastifyApplication> {
  return NestFactory.create<NestFastifyApplication>(FulfilmentModule.forRoot(config), new FastifyAdapter(), {
    // Each applied or duplicate message is a debug line: LOG_LEVEL=debug to see them.
    logger: config.logLevels,
  });
}

/** Listens on HOST:PORT; the address actually bound (its port differs from PORT=0). */
export async function listenFulfilment(app: NestFastifyApplication, config: FulfilmentConfig): Promise<AddressInfo> {
  await app.listen(config.port, config.host);
  return app.getHttpServer().address() as AddressInfo;
}

/** The start-up banner: where it listens as the socket says (not as HOST was spelled), and the token made for this start. */
export function fulfilmentBanner(config: FulfilmentConfig, bound: AddressInfo, applied: string[]): string {
  const lines = [
    `fulfilment listening on http://${browsableHost(bound.address)}:${bound.port} (${boundTo(bound.address)})`,
    `  GET /health open; GET /shipments/{orderId} and GET /metrics need Authorization: Bearer <FULFILMENT_API_TOKEN>`,
    `  consuming fulfilment.order-events (prefetch ${config.prefetch}, up to ${config.batchSize} per transaction, dead-lettered after ${config.maxAttempts} attempts)`,
    `  schema fulfilment${applied.length ? `, applied ${applied.join(', ')}` : ', up to date'}`,
  ];
  if (config.apiTokenGenerated)
    lines.push(`  FULFILMENT_API_TOKEN unset: this start's token (a new one each start): Authorization: Bearer ${config.apiToken}`);
  return lines.join('\n');
}
