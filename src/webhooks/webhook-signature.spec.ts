import { createHmac } from 'node:crypto';
import { Webhook } from 'standardwebhooks';
import { WebhookSignatureError, WebhookSignatureVerifier } from './webhook-signature.js';

const SECRET = `whsec_${Buffer.from('webhook-signature-spec-32-bytes!').toString('base64')}`;
const KEY = Buffer.from(SECRET.slice('whsec_'.length), 'base64');
const hmac = (id: string, timestamp: string, body: Buffer) =>
  'v1,' + createHmac('sha256', KEY).update(`${id}.${timestamp}.`).update(body).digest('base64');
const withByte = (byte: number) => Buffer.concat([Buffer.from('{"note":"'), Buffer.from([byte]), Buffer.from('"}')]);
const now = Math.floor(Date.now() / 1000);
const headersOf = (signature: string, timestamp = String(now), id = 'msg_1') => ({ id, timestamp, signature });
const library = new Webhook(SECRET);
const ours = new WebhookSignatureVerifier(SECRET);
const libraryAccepts = (body: Buffer, h: { id: string; timestamp: string; signature: string }) => {
  try {
    library.verify(body, { 'webhook-id': h.id, 'webhook-timestamp': h.timestamp, 'webhook-signature': h.signature });
    return true;
  } catch {
    return false;
  }
};

describe('WebhookSignatureVerifier: Standard Webhooks over the exact bytes', () => {
  it('accepts the signature of the bytes received, and one valid entry among several (rotation)', () => {
    const body = withByte(0xff);
    expect(ours.verify(body, headersOf(hmac('msg_1', String(now), body)))).toBe('msg_1');
    expect(ours.verify(body, headersOf(`v1,${Buffer.alloc(32, 1).toString('base64')} ${hmac('msg_1', String(now), body)}`))).toBe('msg_1');
  });

  it('refuses a body differing from the signed one in a non-UTF-8 byte, which decoding first lets through', () => {
    // What a signer that decodes as UTF-8 signs for the 0xFF body: U+FFFD, which is also what 0xFE decodes to.
    const header = headersOf(hmac('msg_1', String(now), Buffer.from(withByte(0xff).toString('utf8'))));
    expect(libraryAccepts(withByte(0xfe), header)).toBe(true); // the finding, in the library the service used
    expect(() => ours.verify(withByte(0xfe), header)).toThrow(WebhookSignatureError);
  });

  it('refuses a timestamp that is not whole seconds alone ("<now>junk"), which parseInt lets through', () => {
    const body = Buffer.from('{}');
    const header = headersOf(hmac('msg_1', String(now), body), `${now}junk`);
    expect(libraryAccepts(body, header)).toBe(true); // the finding
    expect(() => ours.verify(body, header)).toThrow('Invalid timestamp');
  });

  it('refuses deliveries older or newer than the tolerance, and missing headers', () => {
    const body = Buffer.from('{}');
    const old = String(now - 301);
    expect(() => ours.verify(body, headersOf(hmac('msg_1', old, body), old))).toThrow('too old');
    const ahead = String(now + 301);
    expect(() => ours.verify(body, headersOf(hmac('msg_1', ahead, body), ahead))).toThrow('too new');
    expect(() => ours.verify(body, { id: undefined, timestamp: String(now), signature: 'v1,x' })).toThrow('Missing required headers');
  });
});
