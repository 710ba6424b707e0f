import { Injectable } from '@nestjs/common';

/** Where this process stands with its broker, for /health. */
@Injectable()
export class BrokerStatus {
  /** The RMQ transport's last reported connection status (connected, disconnected, …). */
  current = 'connecting';
  /** Whether this process holds a consumer on its queue: a connection can be up with none (OrderEventsServer). */
  consuming = false;
}
