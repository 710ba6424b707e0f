import { Module } from '@nestjs/common';
import { SubmitTokensModule } from '../submit-tokens/submit-tokens.module.js';
import { OrdersController } from './orders.controller.js';
import { OrdersService } from './orders.service.js';

@Module({
  imports: [SubmitTokensModule],
  controllers: [OrdersController],
  providers: [OrdersService],
  exports: [OrdersService],
})
export class OrdersModule {}
