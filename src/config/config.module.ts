import { type DynamicModule, Global, Module } from '@nestjs/common';
import type { AppConfig } from './app-config.js';

/** Injection token for the validated AppConfig. */
export const APP_CONFIG = Symbol('APP_CONFIG');

/**
 * Config is loaded and validated before Nest starts (main.ts needs it to start the embedded
 * database), so the module only hands the result to the rest of the app.
 */
@Global()
@Module({})
export class ConfigModule {
  static forRoot(config: AppConfig): DynamicModule {
    return { module: ConfigModule, providers: [{ provide: APP_CONFIG, useValue: config }], exports: [APP_CONFIG] };
  }
}
