import { Controller, Logger } from '@nestjs/common';
import { EventPattern, Payload } from '@nestjs/microservices';
import { IdempotentMessage } from '@idempotent-orders/idempotency/messages';
import { MalformedOrderEvent, type OrderEventType, parseOrderEvent } from './order-event.js';
import { ShipmentsService } from './shipments.service.js';

/** The dedupe marks' consumer name: another consumer of the same events keeps marks of its own. */
export const CONSUMER = 'fulfilment';
const MARKS = { consumer: CONSUMER, table: 'fulfilment.processed_messages' };

/**
 * Each order event, once: @IdempotentMessage claims the message id and runs this in one transaction, then acks.
 * One method per type because Nest routes one pattern per handler; all share the one effect (ShipmentsService.apply).
 */
@Controller()
export class OrderEventsController {
  private readonly logger = new Logger('OrderEvents');

  constructor(private readonly shipments: ShipmentsService) {}

  @EventPattern('order.created')
  @IdempotentMessage(MARKS)
  created(@Payload() data: unknown) {
    return this.apply(data, 'order.created');
  }

  @EventPattern('order.paid')
  @IdempotentMessage(MARKS)
  paid(@Payload() data: unknown) {
    return this.apply(data, 'order.paid');
  }

  @EventPattern('order.cancelled')
  @IdempotentMessage(MARKS)
  cancelled(@Payload() data: unknown) {
    return this.apply(data, 'order.cancelled');
  }

  @EventPattern('order.refunded')
  @IdempotentMessage(MARKS)
  refunded(@Payload() data: unknown) {
    return this.apply(data, 'order.refunded');
  }

  /** The order is gone (lost with a database failover after its events left): undo its shipment. */
  @EventPattern('order.voided')
  @IdempotentMessage(MARKS)
  voided(@Payload() data: unknown) {
    return this.apply(data, 'order.voided');
  }

  private async apply(data: unknown, routedAs: OrderEventType): Promise<void> {
    const event = parseOrderEvent(data);
    // The type routed on (the AMQP `type`) and the body's must agree: which one to believe is not ours to guess.
    if (event.type !== routedAs) throw new MalformedOrderEvent(`routed as ${routedAs} but the body says ${event.type}`);
    const changed = await this.shipments.apply(event);
    if (!changed && event.type !== 'order.created') {
      this.logger.log(
        { eventId: event.eventId, orderId: event.orderId, orderVersion: event.orderVersion },
        `${event.type}: no change (older than the shipment's version, or the shipment is cancelled already)`,
      );
    }
  }
}
