import type { DataSourceOptions } from 'typeorm';
import { IdempotencyKey } from '../idempotency/idempotency-key.entity.js';
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

export const entities = [IdempotencyKey, Order, OrderItem, OrderEvent, SubmitToken, Payment, Refund, ProviderAttempt, ProcessedWebhookEvent, LateChargeRefund];

export interface DatabaseTuning {
  /** Bounds every lock wait; a request that would wait longer fails fast with 55P03 and is told to retry. */
  lockTimeoutMs: number;
  poolSize?: number;
  /** How long a request waits for a free connection before failing with PoolExhaustedError. */
  poolWaitMs?: number;
}

/** One options object for the service, the tests and the migration CLI. */
export function typeormOptions(url: string, tuning: DatabaseTuning): DataSourceOptions {
  return {
    type: 'postgres',
    url,
    entities,
    migrations,
    // The schema changes only through reviewed migrations.
    synchronize: false,
    migrationsRun: false,
    migrationsTransactionMode: 'each',
    uuidExtension: 'pgcrypto',
    extra: {
      max: tuning.poolSize ?? 20,
      connectionTimeoutMillis: tuning.poolWaitMs ?? 0,
      // A request stuck behind a lock longer than a client would wait is better told to retry (409).
      options: `-c lock_timeout=${tuning.lockTimeoutMs} -c statement_timeout=30000 -c idle_in_transaction_session_timeout=60000`,
      application_name: 'idempotent-orders',
      // Statements sent together are not each held back for the previous one's answer (Database.send).
      pipeline: true,
    },
  };
}
