import request from 'supertest';
import { PSP_AUTH } from './test-app';

/** Money at the sandbox provider for an order: its succeeded charges minus the succeeded refunds of them. */
export async function providerMoney(sandboxUrl: string, orderId: string): Promise<{ net: number; charges: number }> {
  const charges = await request(sandboxUrl).get('/psp/charges').set('Authorization', PSP_AUTH).query({ orderId });
  expect(charges.status).toBe(200);
  let net = 0;
  let succeeded = 0;
  for (const charge of charges.body.items as { id: string; status: string; amountMinor: number }[]) {
    if (charge.status !== 'succeeded') continue;
    succeeded++;
    net += charge.amountMinor;
    const refunds = await request(sandboxUrl).get('/psp/refunds').set('Authorization', PSP_AUTH).query({ chargeId: charge.id });
    for (const r of refunds.body.items as { status: string; amountMinor: number }[]) if (r.status === 'succeeded') net -= r.amountMinor;
  }
  return { net, charges: succeeded };
}
