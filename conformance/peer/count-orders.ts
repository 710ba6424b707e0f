/**
 * The effect counter for the peer, which lists nothing over HTTP: the caller's orders in its database.
 *   node dist/conformance/peer/count-orders.js <database URL> <client id>
 */
import pg from 'pg';

const [url, clientId] = process.argv.slice(2);
const client = new pg.Client({ connectionString: url });
await client.connect();
try {
  const { rows } = await client.query<{ n: number }>('SELECT count(*)::int AS n FROM orders WHERE client_id = $1', [clientId]);
  console.log(rows[0].n);
} finally {
  await client.end();
}
