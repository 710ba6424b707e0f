import { ConfigError } from '#service-kit';
import { DEV_PSP_API_KEY, loadSandboxConfig } from './sandbox-config.js';

const PG_URL = 'postgres://app:pw@db.internal:5432/orders';
const WEBHOOK_SECRET = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;
const PROVIDER_KEY = 'sk_test_4f8b1c9e2d7a6053b8e1f4c2a9d7e6b0';

function configError(env: Record<string, string | undefined>): ConfigError {
  try {
    loadSandboxConfig(env);
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return err as ConfigError;
  }
  throw new Error(`loadSandboxConfig accepted ${JSON.stringify(env)}`);
}

describe("loadSandboxConfig: the provider's secret key (PSP_API_KEY)", () => {
  it('is the published dev key alone, on its own embedded database, and the key given otherwise', () => {
    expect(loadSandboxConfig({})).toMatchObject({ apiKey: DEV_PSP_API_KEY, usingDevApiKey: true });
    expect(loadSandboxConfig({ PSP_API_KEY: ` ${PROVIDER_KEY} ` })).toMatchObject({ apiKey: PROVIDER_KEY, usingDevApiKey: false });
    expect(loadSandboxConfig({ DATABASE_URL: PG_URL, PSP_WEBHOOK_SECRET: WEBHOOK_SECRET, PSP_API_KEY: PROVIDER_KEY })).toMatchObject({
      apiKey: PROVIDER_KEY,
    });
  });

  it('is required with DATABASE_URL, where the published dev key is refused, as the dev webhook secret is', () => {
    for (const given of [{}, { PSP_API_KEY: DEV_PSP_API_KEY }]) {
      const err = configError({ DATABASE_URL: PG_URL, PSP_WEBHOOK_SECRET: WEBHOOK_SECRET, ...given });
      expect(err.variables).toEqual(['PSP_API_KEY']);
      expect(err.message).toContain('PSP_API_KEY is required when DATABASE_URL is set, and must not be the published dev key');
      expect(err.message).not.toContain(DEV_PSP_API_KEY);
    }
  });

  it('refuses a key a client could not send as a bearer token, never printing it', () => {
    for (const bad of ['sk_short', `${PROVIDER_KEY} ${PROVIDER_KEY}`, `sk_${'x'.repeat(600)}`]) {
      const err = configError({ PSP_API_KEY: bad });
      expect(err.variables).toEqual(['PSP_API_KEY']);
      expect(err.message).not.toContain(bad);
    }
  });
});
