import { Injectable, type OnApplicationBootstrap } from '@nestjs/common';
import { Database } from '@idempotent-orders/idempotency';
import { StartupError } from '#service-kit';

/**
 * This deployment's id (the one row of `deployment`, made by its first migration): sent as every charge's
 * `metadata.deploymentId`, and how the repairs of lost payments tell this deployment's charges from those of others
 * sharing the provider account. Read once, at start-up, so no payment or webhook waits on it (or fails for it).
 */
@Injectable()
export class DeploymentId implements OnApplicationBootstrap {
  private id?: string;

  constructor(private readonly db: Database) {}

  async onApplicationBootstrap(): Promise<void> {
    const [row] = await this.db.query<{ id: string }>(`SELECT id FROM deployment`);
    if (!row) throw new StartupError('the deployment table has no row: apply the migrations (npm run migration:run)');
    this.id = row.id;
  }

  get value(): string {
    if (this.id === undefined) throw new Error('DeploymentId is read at start-up (onApplicationBootstrap), not before');
    return this.id;
  }
}
