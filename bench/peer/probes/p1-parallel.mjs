// 20 parallel identical requests with one new key -> how many orders, which statuses.
import { postOrder, histogram, ordersFor, closeDb, rid, items, report, sleep, arg, client } from './common.mjs';
const n = Number(arg('n', 20));
const { token, clientId } = client('p1');
const key = `k-${rid()}`;
const body = { currency: 'EUR', items: items() }; // no orderNumber: the DB unique constraint must not mask duplicates
const res = await Promise.all(Array.from({ length: n }, () => postOrder({ key, token, body })));
await sleep(300);
const after = await postOrder({ key, token, body });
const orders = await ordersFor(clientId);
const ids = new Set(res.filter((r) => r.status === 201).map((r) => r.json.id));
report(
  `p1 parallel x${n} ${arg('label', '')}`.trim(),
  `orders created=${orders}; statuses=${JSON.stringify(histogram(res))}; distinct order ids in 201s=${ids.size}; ` +
    `retry after 300ms=${after.status}${after.replayed ? ' replayed' : ''}`,
  { orders, statuses: histogram(res), distinctIds: ids.size, after: after.status, afterReplayed: after.replayed },
);
await closeDb();
