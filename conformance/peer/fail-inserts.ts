/**
 * The 5xx check's arm and disarm commands: while armed, an order totalling FAILING_TOTAL fails to insert (a 500).
 *   node dist/conformance/peer/fail-inserts.js arm|disarm <database URL>
 */
import pg from 'pg';
import { FAILING_TOTAL } from './failing-total.js';

const [action, url] = process.argv.slice(2);
if (action !== 'arm' && action !== 'disarm') throw new Error('usage: fail-inserts.js arm|disarm <database URL>');
const client = new pg.Client({ connectionString: url });
await client.connect();
try {
  if (action === 'arm') {
    await client.query(
      `CREATE FUNCTION conformance_fail() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'provoked by the conformance kit'; END $$`,
    );
    await client.query(
      `CREATE TRIGGER conformance_fail BEFORE INSERT ON orders FOR EACH ROW WHEN (NEW.total_minor = ${FAILING_TOTAL}) EXECUTE FUNCTION conformance_fail()`,
    );
  } else {
    await client.query('DROP TRIGGER IF EXISTS conformance_fail ON orders; DROP FUNCTION IF EXISTS conformance_fail()');
  }
} finally {
  await client.end();
}
