import { resolveOptions } from './idempotency-options.js';

describe('resolveOptions: escapingWrites', () => {
  const nodeEnv = process.env.NODE_ENV;
  afterEach(() => {
    process.env.NODE_ENV = nodeEnv;
  });

  it.each(['production', 'development', 'test'])('refuses by default under NODE_ENV=%s: logging only is never a default', (env) => {
    process.env.NODE_ENV = env;
    expect(resolveOptions({ callerScope: () => 'caller' }).escapingWrites).toBe('refuse');
  });

  it('logs only when the app asks for it', () => {
    expect(resolveOptions({ callerScope: () => 'caller', escapingWrites: 'log' }).escapingWrites).toBe('log');
  });
});
