import { collectDefaultMetrics, Registry } from 'prom-client';

/** This app's Prometheus registry: the layer's `idempotent_messages_total` and the process's defaults. */
export const METRICS_REGISTRY = Symbol('METRICS_REGISTRY');

export function createMetricsRegistry(): Registry {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  return registry;
}
