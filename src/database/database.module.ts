import { Inject, Injectable, Module, type OnApplicationBootstrap } from '@nestjs/common';
import { Database } from '@idempotent-orders/idempotency';
import type { AppConfig } from '../config/app-config.js';
import { APP_CONFIG } from '../config/config.module.js';
import { poolerSuspicion, StartupError } from '#service-kit';

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

/** `synchronous-standby`: a commit is acknowledged once a standby has it too; `primary-only`: once the primary alone has it. */
export type CommitDurability = 'synchronous-standby' | 'primary-only';

/**
 * Whether a failover can lose a commit the service has acknowledged. PostgreSQL waits for a synchronous standby when
 * synchronous_standby_names names one and synchronous_commit asks for it; Patroni's synchronous_mode keeps the first
 * set only while a standby is in sync, so the settings say what holds right now. Read by start-up and by /health.
 */
@Injectable()
export class CommitDurabilityCheck implements OnApplicationBootstrap {
  constructor(
    private readonly db: Database,
    @Inject(APP_CONFIG) private readonly config: AppConfig,
  ) {}

  async current(): Promise<CommitDurability> {
    const [{ synchronous }] = await this.db.query<{ synchronous: boolean }>(
      `SELECT current_setting('synchronous_standby_names') <> ''
          AND current_setting('synchronous_commit') IN ('on', 'remote_write', 'remote_apply') AS synchronous`,
    );
    return synchronous ? 'synchronous-standby' : 'primary-only';
  }

  async onApplicationBootstrap(): Promise<void> {
    if (!this.config.databaseRequireSynchronousStandby || (await this.current()) === 'synchronous-standby') return;
    throw new StartupError(
      'DATABASE_REQUIRE_SYNCHRONOUS_STANDBY=true, and the primary acknowledges commits alone (synchronous_standby_names is empty ' +
        'or synchronous_commit is off/local): a failover could lose acknowledged writes. Give it a synchronous standby ' +
        '(Patroni: synchronous_mode: true) or unset the variable',
    );
  }
}

/** What the service checks of its database at start-up (the connection itself is TypeOrmModule's, the transactions the layer's). */
@Module({ providers: [PoolerCheck, CommitDurabilityCheck], exports: [CommitDurabilityCheck] })
export class DatabaseModule {}
