// Two clients using the same Idempotency-Key. The peer keys its store by METHOD+URL+key only.
import { postOrder, ordersFor, closeDb, rid, items, report, arg, client, why } from './common.mjs';
const A = client('p3a');
const B = client('p3b');
const key = `shared-${rid()}`;
const bodyA = { currency: 'EUR', items: items('a') };
const bodyB = { currency: 'USD', items: items('b') };
const a = await postOrder({ key, token: A.token, body: bodyA });
const bSame = await postOrder({ key, token: B.token, body: bodyA }); // B sends the identical body
const bDiff = await postOrder({ key, token: B.token, body: bodyB }); // B sends its own, different body
const [oa, ob] = [await ordersFor(A.clientId), await ordersFor(B.clientId)];
const leaked = a.json?.id !== undefined && bSame.json?.id === a.json.id;
report(
  `p3 scoping ${arg('label', '')}`.trim(),
  `A: ${a.status}; B same key+same body: ${bSame.status}${bSame.replayed ? ' replayed' : ''}` +
    ` (${leaked ? "got A's order" : 'its own order'})` +
    `; B same key+different body: ${bDiff.status}${bDiff.replayed ? ' replayed' : ''}${why(bDiff) ? ` (${why(bDiff)})` : ''}` +
    `; orders A=${oa} B=${ob}`,
  { a: a.status, bSame: bSame.status, bSameReplayed: bSame.replayed, leaked, bDiff: bDiff.status, ordersA: oa, ordersB: ob },
);
await closeDb();
