import 'reflect-metadata';
import { NestFactory } from '@nestjs/core';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { assertDeadLetterTopology, rmqOptions } from './broker.js';
import { BrokerStatus } from './broker-status.js';
import { OrderEventsServer } from './order-events-server.js';
import { FulfilmentConfigError, loadFulfilmentConfig } from './config.js';
import { FulfilmentModule } from './fulfilment.module.js';
import { migrateFulfilment } from './migrate.js';

/**
 * `npm run start:fulfilment`: one process, two doors — the RMQ consumer of the order events (a Nest microservice
 * connected to the HTTP app: a hybrid app) and HTTP on PORT.
 */
async function bootstrap(): Promise<void> {
  const config = loadFulfilmentConfig();
  const applied = await migrateFulfilment(config.databaseUrl);
  await assertDeadLetterTopology(config.amqpUrls).catch((err: unknown) => {
    throw new FulfilmentConfigError(`AMQP_URL: cannot reach the broker (${(err as Error).message})`);
  });

  const app = await NestFactory.create<NestFastifyApplication>(FulfilmentModule.forRoot(config), new FastifyAdapter(), {
    // Each applied or duplicate message is a debug line: LOG_LEVEL=debug to see them.
    logger: config.logLevels,
  });
  const status = app.get(BrokerStatus);
  const microservice = app.connectMicroservice({ strategy: new OrderEventsServer(rmqOptions(config), status) }, { inheritAppConfig: true });
  // The transport reconnects by itself (amqp-connection-manager) and reports each step here; unblocked is connected again.
  microservice.status.subscribe((s) => (status.current = String(s) === 'unblocked' ? 'connected' : String(s)));
  app.enableShutdownHooks();
  await app.startAllMicroservices();
  await app.listen(config.port, '0.0.0.0');
  const port = (app.getHttpServer().address() as { port: number }).port;
  console.log(
    [
      `fulfilment listening on http://localhost:${port} (GET /health, GET /shipments/{orderId}, GET /metrics)`,
      `  consuming fulfilment.order-events (prefetch ${config.prefetch}, up to ${config.batchSize} per transaction, dead-lettered after ${config.maxAttempts} attempts)`,
      `  schema fulfilment${applied.length ? `, applied ${applied.join(', ')}` : ', up to date'}`,
    ].join('\n'),
  );
}

bootstrap().catch((err: unknown) => {
  console.error(err instanceof FulfilmentConfigError ? err.message : err);
  process.exit(1);
});
