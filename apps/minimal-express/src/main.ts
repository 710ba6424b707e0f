import { Logger, ValidationPipe } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import type { AddressInfo, Server } from 'node:net';
import { AppModule } from './app.module.js';

const databaseUrl = process.env.DATABASE_URL;
if (!databaseUrl) {
  console.error('DATABASE_URL must be set: the PostgreSQL database this app migrates and uses.');
  process.exit(1);
}
const app = await NestFactory.create(AppModule.forRoot({ databaseUrl }));
app.useGlobalPipes(new ValidationPipe({ whitelist: true, forbidNonWhitelisted: true }));
app.enableShutdownHooks();
await app.listen(Number(process.env.PORT ?? 3001), '127.0.0.1');
new Logger('MinimalExpress').log(`listening on http://localhost:${((app.getHttpServer() as Server).address() as AddressInfo).port}`);
