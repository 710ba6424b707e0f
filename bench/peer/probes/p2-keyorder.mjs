// Same key + the same JSON with object keys in a different order (and different whitespace) -> replay or 422?
import { postOrder, ordersFor, closeDb, rid, report, arg, client, why } from './common.mjs';
const { token, clientId } = client('p2');
const A = '{"currency":"EUR","items":[{"sku":"a","quantity":1,"unitPriceMinor":100}]}';
const ws = '{ "currency" : "EUR",\n  "items" : [ { "sku":"a", "quantity":1, "unitPriceMinor":100 } ] }';
const topReordered = '{"items":[{"sku":"a","quantity":1,"unitPriceMinor":100}],"currency":"EUR"}';
const itemReordered = '{"currency":"EUR","items":[{"unitPriceMinor":100,"quantity":1,"sku":"a"}]}';
const out = {};
for (const [name, variant] of [
  ['whitespace-only', ws],
  ['top-level keys reordered', topReordered],
  ['item keys reordered', itemReordered],
]) {
  const key = `k-${rid()}`;
  const first = await postOrder({ key, token, body: A });
  const second = await postOrder({ key, token, body: variant });
  out[name] = { first: first.status, second: second.status, replayed: second.replayed, message: why(second) };
}
const orders = await ordersFor(clientId);
report(
  `p2 key-order ${arg('label', '')}`.trim(),
  Object.entries(out)
    .map(([k, v]) => `${k}: ${v.first} then ${v.second}${v.replayed ? ' replayed' : ''}${v.message ? ` (${v.message})` : ''}`)
    .join('; ') + `; orders=${orders} (3 keys)`,
  { out, orders, rejected: Object.values(out).filter((v) => v.second === 422).length },
);
await closeDb();
