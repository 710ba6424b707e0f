import { type DynamicModule, type InjectionToken, Module, type ModuleMetadata } from '@nestjs/common';
import { PspClient } from './psp-client.js';
import { PspClientMetrics } from './psp-client-metrics.js';
import { PSP_CLIENT_OPTIONS, type PspClientOptions } from './psp-client-options.js';

export interface PspClientModuleAsyncOptions {
  imports?: ModuleMetadata['imports'];
  inject?: InjectionToken[];
  useFactory: (...args: never[]) => PspClientOptions | Promise<PspClientOptions>;
}

/**
 * Global, and registered once (in AppModule): the client holds the breakers, so there must be one
 * per process, shared by payments, refunds and the reconciler. Needs the global MetricsModule.
 */
@Module({})
export class PspClientModule {
  static forRootAsync(options: PspClientModuleAsyncOptions): DynamicModule {
    return {
      module: PspClientModule,
      global: true,
      imports: options.imports ?? [],
      providers: [
        { provide: PSP_CLIENT_OPTIONS, useFactory: options.useFactory, inject: options.inject ?? [] },
        PspClientMetrics,
        {
          provide: PspClient,
          useFactory: (clientOptions: PspClientOptions, metrics: PspClientMetrics) => new PspClient(clientOptions, metrics),
          inject: [PSP_CLIENT_OPTIONS, PspClientMetrics],
        },
      ],
      exports: [PspClient],
    };
  }
}
