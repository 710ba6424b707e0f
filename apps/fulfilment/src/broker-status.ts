import { Injectable } from '@nestjs/common';

/** The RMQ transport's last reported status (connected, disconnected, …), for /health. */
@Injectable()
export class BrokerStatus {
  current = 'connecting';
}
