import { type DynamicModule, Module } from '@nestjs/common';
import { APP_FILTER } from '@nestjs/core';
import { TypeOrmModule } from '@nestjs/typeorm';
import { IdempotencyKey, IdempotencyModule, ProblemDetailsFilter } from '@idempotent-orders/idempotency';
import { IdempotencyKeys1750000000000 } from '../migrations/1750000000000-idempotency-keys.js';
import { Transfers1750000100000 } from '../migrations/1750000100000-transfers.js';
import { Transfer } from './transfer.entity.js';
import { TransfersController } from './transfers.controller.js';
import { TransfersService } from './transfers.service.js';

/**
 * A minimal app that uses the Idempotency-Key layer the way a NestJS user would: Express, one
 * entity, TypeORM repositories, the layer through its public entry only.
 */
@Module({})
export class AppModule {
  static forRoot({ databaseUrl }: { databaseUrl: string }): DynamicModule {
    return {
      module: AppModule,
      imports: [
        TypeOrmModule.forRoot({
          type: 'postgres',
          url: databaseUrl,
          entities: [Transfer, IdempotencyKey],
          migrations: [IdempotencyKeys1750000000000, Transfers1750000100000],
          migrationsRun: true,
          synchronize: false,
        }),
        TypeOrmModule.forFeature([Transfer]),
        IdempotencyModule.forRoot({
          // Keys are scoped to the caller; a real app takes it from its authentication.
          callerScope: (req) => {
            const clientId = req.headers['x-client-id'];
            return typeof clientId === 'string' && clientId !== '' ? clientId : undefined;
          },
        }),
      ],
      controllers: [TransfersController],
      providers: [TransfersService, { provide: APP_FILTER, useClass: ProblemDetailsFilter }],
    };
  }
}
