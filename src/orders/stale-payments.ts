import { type CallHandler, type ExecutionContext, Injectable, type NestInterceptor } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import { isUUID } from 'class-validator';
import type { FastifyRequest } from 'fastify';
import type { Observable } from 'rxjs';

/**
 * Who settles a pending payment whose request gave up (its lease ran out), so that a cancel is not refused for a
 * payment nobody is deciding any more. Orders declare what they need; the payments module provides it (its
 * reconciler) under this token. Orders import nothing of payments.
 */
export interface StalePaymentSettler {
  settleStalePaymentsOf(clientId: string, orderId: string): Promise<void>;
}
export const STALE_PAYMENT_SETTLER = Symbol('STALE_PAYMENT_SETTLER');

/**
 * On the cancel route, outermost (listed below @IdempotentEndpoint): settles the order's stale payments BEFORE the
 * idempotency layer opens its transaction. Settling asks the provider and may wait a second between two look-ups; done
 * inside, it would hold a connection and the key's lock across them, and need a second connection meanwhile.
 */
@Injectable()
export class SettleStalePaymentsFirst implements NestInterceptor {
  private settler?: StalePaymentSettler | null;

  constructor(private readonly moduleRef: ModuleRef) {}

  async intercept(context: ExecutionContext, next: CallHandler): Promise<Observable<unknown>> {
    const request = context.switchToHttp().getRequest<FastifyRequest & { params?: { id?: string } }>();
    const orderId = request.params?.id;
    const settler = this.settlerOf();
    if (settler && request.clientId && orderId !== undefined && isUUID(orderId))
      await settler.settleStalePaymentsOf(request.clientId, orderId);
    return next.handle();
  }

  /** Looked up across modules once: an app without payments (none provides it) has nothing to settle. */
  private settlerOf(): StalePaymentSettler | null {
    if (this.settler === undefined) {
      try {
        this.settler = this.moduleRef.get<StalePaymentSettler>(STALE_PAYMENT_SETTLER, { strict: false });
      } catch {
        this.settler = null;
      }
    }
    return this.settler;
  }
}
