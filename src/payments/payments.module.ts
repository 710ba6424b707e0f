import { Module } from '@nestjs/common';
import { OrdersModule } from '../orders/orders.module.js';
import { STALE_PAYMENT_SETTLER } from '../orders/stale-payments.js';
import { LateChargeRefunder } from './late-charge-refunder.js';
import { DeploymentId } from './deployment-id.js';
import { LostPayments } from './lost-payments.js';
import { PaymentMetrics } from './payment-metrics.js';
import { PaymentReconciler } from './payment-reconciler.js';
import { ProviderAttempts } from './provider-attempts.js';
import { ProviderChargeSweep } from './provider-charge-sweep.js';
import { PaymentSettlement } from './payment-settlement.js';
import { PaymentsController } from './payments.controller.js';
import { PaymentsService } from './payments.service.js';
import { RefundsController } from './refunds.controller.js';
import { RefundsService } from './refunds.service.js';

@Module({
  imports: [OrdersModule],
  controllers: [PaymentsController, RefundsController],
  providers: [
    PaymentsService,
    RefundsService,
    PaymentSettlement,
    PaymentReconciler,
    PaymentMetrics,
    LateChargeRefunder,
    LostPayments,
    DeploymentId,
    ProviderAttempts,
    ProviderChargeSweep,
    // What a cancel asks for (src/orders/stale-payments.ts): orders declare it, payments provide it.
    { provide: STALE_PAYMENT_SETTLER, useExisting: PaymentReconciler },
  ],
  exports: [PaymentSettlement, LateChargeRefunder, LostPayments, PaymentMetrics],
})
export class PaymentsModule {}
