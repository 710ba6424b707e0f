/**
 * The outbox relays' shared shape (`#outbox-relay`): the round loop (lease/wake/backoff) and the LISTEN connection.
 * The sandbox's webhook relay and the order events relay both run on it; each keeps what it claims and how it sends.
 */
export { listenForNotifications, type ListenOptions, type NotificationListener } from './listen-for-notifications.js';
export { RelayLoop, type RelayLoopOptions, retryDelayMs } from './relay-loop.js';
