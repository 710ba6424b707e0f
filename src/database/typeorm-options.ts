import type { DataSourceOptions } from 'typeorm';
import { IdempotencyKey } from '@idempotent-orders/idempotency';
import { Order } from '../orders/order.entity.js';
import { OrderEvent } from '../orders/order-event.entity.js';
import { OrderItem } from '../orders/order-item.entity.js';
import { Payment } from '../payments/payment.entity.js';
import { ProviderAttempt } from '../payments/provider-attempt.entity.js';
import { Refund } from '../payments/refund.entity.js';
import { SubmitToken } from '../submit-tokens/submit-token.entity.js';
import { LateChargeRefund } from '../webhooks/late-charge-refund.entity.js';
import { ProcessedWebhookEvent } from '../webhooks/processed-webhook-event.entity.js';
import { migrations } from '../../migrations/index.js';
import { pspSandboxMigrations } from '#psp-sandbox';

export const entities = [
  IdempotencyKey,
  Order,
  OrderItem,
  OrderEvent,
  SubmitToken,
  Payment,
  Refund,
  ProviderAttempt,
  ProcessedWebhookEvent,
  LateChargeRefund,
];

export interface DatabaseTuning {
  /**
   * A session lock_timeout (and statement and idle-in-transaction timeouts) for every connection of
   * the pool, sent as the startup `options`: for tools on a direct connection (the migration CLI,
   * tests, the bench). The service passes none: its settings ride with each transaction
   * (Database), since a transaction pooler such as PgBouncer refuses startup `options`.
   */
  lockTimeoutMs?: number;
  poolSize?: number;
  /** How long a request waits for a free connection before failing with PoolExhaustedError. */
  poolWaitMs?: number;
}

/**
 * The service's migrations, and the sandbox provider's where it is mounted in-process (AppConfig.pspSandbox): one
 * DataSource, one migrations table, one timestamp order — the order they ran in when the sandbox's were the service's.
 */
export function serviceMigrations(pspSandbox: 'in-process' | 'off') {
  return pspSandbox === 'in-process' ? [...migrations, ...pspSandboxMigrations] : migrations;
}

/** One options object for the service, the tests and the migration CLI; the tools run the sandbox in-process. */
export function typeormOptions(url: string, tuning: DatabaseTuning, pspSandbox: 'in-process' | 'off' = 'in-process'): DataSourceOptions {
  return {
    type: 'postgres',
    url,
    entities,
    migrations: serviceMigrations(pspSandbox),
    // The schema changes only through reviewed migrations.
    synchronize: false,
    migrationsRun: false,
    migrationsTransactionMode: 'each',
    uuidExtension: 'pgcrypto',
    extra: {
      max: tuning.poolSize ?? 20,
      connectionTimeoutMillis: tuning.poolWaitMs ?? 0,
      ...(tuning.lockTimeoutMs === undefined
        ? {}
        : { options: `-c lock_timeout=${tuning.lockTimeoutMs} -c statement_timeout=30000 -c idle_in_transaction_session_timeout=60000` }),
      application_name: 'idempotent-orders',
    },
  };
}
