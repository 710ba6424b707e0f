import { Inject, Injectable, Module, type OnApplicationBootstrap } from '@nestjs/common';
import { Database } from '@idempotent-orders/idempotency';
import type { AppConfig } from '../config/app-config.js';
import { APP_CONFIG } from '../config/config.module.js';
import { poolerSuspicion } from '#service-kit';

/**
 * Refuses to start when named statements were left at their default and the server that answers
 * is not the one DATABASE_URL names (a pooler in between, most likely): the choice must be made.
 */
@Injectable()
export class PoolerCheck implements OnApplicationBootstrap {
  constructor(
    private readonly db: Database,
    @Inject(APP_CONFIG) private readonly config: AppConfig,
  ) {}

  async onApplicationBootstrap(): Promise<void> {
    if (this.config.databasePreparedStatements !== undefined || !this.config.databaseUrl) return;
    const [{ port }] = await this.db.query<{ port: number | null }>('SELECT inet_server_port() AS port');
    const suspicion = poolerSuspicion(this.config.databaseUrl, port);
    if (suspicion) throw suspicion;
  }
}

/** What the service checks of its database at start-up (the connection itself is TypeOrmModule's, the transactions the layer's). */
@Module({ providers: [PoolerCheck] })
export class DatabaseModule {}
