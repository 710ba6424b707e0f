import { Injectable } from '@nestjs/common';
import { Database } from '@idempotent-orders/idempotency';

/**
 * This deployment's id (the one row of `deployment`, made by its first migration): sent as every charge's
 * `metadata.deploymentId`, and how the repairs of lost payments tell this deployment's charges from those of others
 * sharing the provider account. Read once per process.
 */
@Injectable()
export class DeploymentId {
  private loaded?: Promise<string>;

  constructor(private readonly db: Database) {}

  get(): Promise<string> {
    // A failed read (the database away) is tried again by the next caller.
    this.loaded ??= this.read().catch((err: unknown) => {
      this.loaded = undefined;
      throw err;
    });
    return this.loaded;
  }

  private async read(): Promise<string> {
    // Outside any caller's transaction: a caller whose transaction fails must not fail the others waiting on this read.
    const [row] = await this.db.outsideTransaction(() => this.db.query<{ id: string }>(`SELECT id FROM deployment`));
    if (!row) throw new Error('the deployment table has no row: run the migrations');
    return row.id;
  }
}
