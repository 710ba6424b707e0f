import { Module } from '@nestjs/common';
import { IdempotencyModule } from '../idempotency/idempotency.module.js';
import { OrdersModule } from '../orders/orders.module.js';
import { PaymentReconciler } from './payment-reconciler.js';
import { PaymentSettlement } from './payment-settlement.js';
import { PaymentsController } from './payments.controller.js';
import { PaymentsService } from './payments.service.js';
import { RefundsController } from './refunds.controller.js';
import { RefundsService } from './refunds.service.js';

@Module({
  imports: [IdempotencyModule, OrdersModule],
  controllers: [PaymentsController, RefundsController],
  providers: [PaymentsService, RefundsService, PaymentSettlement, PaymentReconciler],
  exports: [PaymentSettlement],
})
export class PaymentsModule {}
