import 'reflect-metadata';
import { assertDeadLetterTopology, rmqOptions } from './broker.js';
import { BrokerStatus } from './broker-status.js';
import { OrderEventsServer } from './order-events-server.js';
import { FulfilmentConfigError, loadFulfilmentConfig } from './config.js';
import { createFulfilmentApp, fulfilmentBanner, listenFulfilment } from './http-app.js';
import { migrateFulfilment } from './migrate.js';

/**
 * `npm run start:fulfilment`: one process, two doors — the RMQ consumer of the order events (a Nest microservice
 * connected to the HTTP app: a hybrid app) and HTTP on HOST:PORT.
 */
async function bootstrap(): Promise<void> {
  const config = loadFulfilmentConfig();
  const applied = await migrateFulfilment(config.databaseUrl);
  await assertDeadLetterTopology(config.amqpUrls).catch((err: unknown) => {
    throw new FulfilmentConfigError(`AMQP_URL: cannot reach the broker (${(err as Error).message})`);
  });

  const app = await createFulfilmentApp(config);
  const status = app.get(BrokerStatus);
  const microservice = app.connectMicroservice({ strategy: new OrderEventsServer(rmqOptions(config), status) }, { inheritAppConfig: true });
  // The transport reconnects by itself (amqp-connection-manager) and reports each step here; unblocked is connected again.
  microservice.status.subscribe((s) => (status.current = String(s) === 'unblocked' ? 'connected' : String(s)));
  app.enableShutdownHooks();
  await app.startAllMicroservices();
  const bound = await listenFulfilment(app, config);
  console.log(fulfilmentBanner(config, bound, applied));
}

bootstrap().catch((err: unknown) => {
  console.error(err instanceof FulfilmentConfigError ? err.message : err);
  process.exit(1);
});
