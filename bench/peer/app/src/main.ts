import 'reflect-metadata';
import { NestFactory } from '@nestjs/core';
import { AppModule } from './app.module';

// The runner (bench/peer/*.mjs) starts the embedded PostgreSQL
// (the service's own libs/service-kit/src/embedded-postgres.ts, built) and passes DATABASE_URL.
async function bootstrap() {
  const databaseUrl = process.env.DATABASE_URL;
  if (!databaseUrl) throw new Error('DATABASE_URL is required (bench/peer/run.mjs starts the database)');
  const storage = (process.env.STORAGE ?? 'memory') as 'memory' | 'redis';
  if (storage !== 'memory' && storage !== 'redis') throw new Error('STORAGE must be memory|redis');
  const app = await NestFactory.create(
    AppModule.forRoot({
      databaseUrl: databaseUrl!,
      storage,
      redisUrl: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379',
      poolMax: Number(process.env.POOL_MAX ?? 10),
    }),
    { logger: ['error', 'warn'] },
  );
  app.enableShutdownHooks();
  const port = Number(process.env.PORT ?? 3000);
  await app.listen(port, '127.0.0.1');
  console.log(`peer app listening on 127.0.0.1:${port} storage=${storage} pid=${process.pid}`);
}
bootstrap().catch((e) => {
  console.error(e);
  process.exit(1);
});
