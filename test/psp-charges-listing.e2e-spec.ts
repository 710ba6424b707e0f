import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { monotonicNow } from '@idempotent-orders/idempotency';
import { PspClient, type PspCharge } from '../src/psp-client/psp-client';
import { ALICE, bearer, PSP_AUTH, startTestApp, type TestApp } from './support/test-app';

/**
 * The sandbox provider's listing of recent charges (GET /psp/charges?createdAfter=…&startingAfter=…&limit=…), page by
 * page, over real HTTP and through the service's own PspClient: what a sweep reads to find charges our database lost.
 * Each case gives its charges the created_at it needs (ties on purpose) with one UPDATE, so no case depends on the
 * clock's resolution; each case's charges come after every earlier case's.
 */

interface Page {
  items: PspCharge[];
  hasMore: boolean;
}

describe('psp sandbox: listing charges page by page', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp();
  });
  afterAll(async () => {
    await t?.close();
  });

  const charge = async () => {
    const body = { amountMinor: 2599, currency: 'EUR', source: 'tok_visa', metadata: { orderId: randomUUID(), paymentId: randomUUID() } };
    const res = await request(t.url).post('/psp/charges').set('Authorization', PSP_AUTH).set('Idempotency-Key', randomUUID()).send(body);
    expect(res.status).toBe(201);
    return res.body as PspCharge;
  };
  /** Moves each charge to `base` plus its offset in ms; the charges as the provider now answers them. */
  const place = async (base: string, moves: [PspCharge, number][]): Promise<PspCharge[]> => {
    for (const [c, ms] of moves)
      await t.db.query(`UPDATE psp.charges SET created_at = $2::timestamptz + $3 * interval '1 millisecond' WHERE id = $1`, [
        c.id,
        base,
        ms,
      ]);
    return Promise.all(moves.map(async ([c]) => (await list({ paymentId: c.metadata.paymentId })).items[0]));
  };
  const get = (query: Record<string, string | number>) => request(t.url).get('/psp/charges').set('Authorization', PSP_AUTH).query(query);
  const list = async (query: Record<string, string | number>): Promise<Page> => {
    const res = await get(query);
    expect(res.status).toBe(200);
    return res.body as Page;
  };
  /** Every page from the first, following startingAfter until hasMore is false (at most 20). */
  const allPages = async (query: Record<string, string | number>): Promise<Page[]> => {
    const pages = [await list(query)];
    while (pages.at(-1)!.hasMore && pages.length < 20) pages.push(await list({ ...query, startingAfter: pages.at(-1)!.items.at(-1)!.id }));
    return pages;
  };
  const ids = (charges: PspCharge[]) => charges.map((c) => c.id);
  /** The charges after `createdAfter` in the order the listing promises, read from the sandbox's table. */
  const inOrder = async (createdAfter: string) =>
    (await t.db.query(`SELECT id FROM psp.charges WHERE created_at > $1 ORDER BY created_at, id`, [createdAfter])).rows.map(
      (r: { id: string }) => r.id,
    );

  it('pages hold every charge created after createdAfter exactly once, in (createdAt, id) order; the last says hasMore false', async () => {
    const first = await charge();
    const made = await Promise.all(Array.from({ length: 7 }, () => charge()));
    // Four charges at one instant and two at another: a page boundary certainly falls between charges of the same instant.
    const placed = await place(first.createdAt, [
      [made[0], 1],
      [made[1], 1],
      [made[2], 1],
      [made[3], 1],
      [made[4], 2],
      [made[5], 3],
      [made[6], 3],
    ]);
    const expected = await inOrder(first.createdAt);
    expect([...expected].sort()).toEqual(ids(placed).sort());

    const pages = await allPages({ createdAfter: first.createdAt, limit: 2 });
    expect(pages.map((p) => [p.items.length, p.hasMore])).toEqual([
      [2, true],
      [2, true],
      [2, true],
      [1, false],
    ]);
    const listed = pages.flatMap((p) => p.items);
    expect(ids(listed)).toEqual(expected);
    // Each item is the charge as a lookup by its paymentId answers it.
    const byId = new Map(placed.map((c) => [c.id, c]));
    for (const item of listed) expect(item).toEqual(byId.get(item.id));

    // A page exactly as long as what is left, the default limit, and the page after the last charge.
    expect(await list({ createdAfter: first.createdAt, limit: 7 })).toEqual({ items: listed, hasMore: false });
    expect(await list({ createdAfter: first.createdAt })).toEqual({ items: listed, hasMore: false });
    expect(await list({ createdAfter: first.createdAt, startingAfter: listed[6].id })).toEqual({ items: [], hasMore: false });
    // A cursor in the middle of a tie continues after that very charge.
    expect(ids((await list({ createdAfter: first.createdAt, startingAfter: listed[1].id, limit: 3 })).items)).toEqual(expected.slice(2, 5));
  });

  it('createdAfter leaves out charges created at or before it; a lookup by id answers hasMore false', async () => {
    const older = await charge();
    const [newer] = await place(older.createdAt, [[await charge(), 1]]);
    const justBefore = new Date(Date.parse(older.createdAt) - 1).toISOString();
    expect(await list({ createdAfter: justBefore })).toEqual({ items: [older, newer], hasMore: false });
    expect(await list({ createdAfter: older.createdAt })).toEqual({ items: [newer], hasMore: false });
    // The same instant written with another offset.
    const atPlusTwo = new Date(Date.parse(older.createdAt) + 2 * 3_600_000).toISOString().replace('Z', '+02:00');
    expect(await list({ createdAfter: atPlusTwo })).toEqual({ items: [newer], hasMore: false });
    expect(await list({ createdAfter: newer.createdAt })).toEqual({ items: [], hasMore: false });
    // With a cursor, whichever of the two is later bounds the page.
    expect(await list({ createdAfter: justBefore, startingAfter: older.id })).toEqual({ items: [newer], hasMore: false });
    expect(await list({ createdAfter: older.createdAt, startingAfter: older.id })).toEqual({ items: [newer], hasMore: false });
    expect(await list({ createdAfter: newer.createdAt, startingAfter: older.id })).toEqual({ items: [], hasMore: false });
    expect(await list({ createdAfter: justBefore, startingAfter: newer.id })).toEqual({ items: [], hasMore: false });

    expect(await list({ paymentId: older.metadata.paymentId })).toEqual({ items: [older], hasMore: false });
    expect(await list({ orderId: randomUUID() })).toEqual({ items: [], hasMore: false });
  });

  it("the service's PspClient lists two pages, and gets refused for a cursor that names no charge", async () => {
    const psp = t.app.get(PspClient);
    const first = await charge();
    const placed = await place(first.createdAt, [
      [await charge(), 1],
      [await charge(), 2],
      [await charge(), 3],
    ]);
    const createdAfter = new Date(first.createdAt);
    const deadline = monotonicNow() + 30_000;
    expect(await psp.listCharges({ createdAfter, limit: 2 }, deadline)).toEqual({
      kind: 'succeeded',
      value: { items: placed.slice(0, 2), hasMore: true },
    });
    expect(await psp.listCharges({ createdAfter, startingAfter: placed[1].id, limit: 2 }, deadline)).toEqual({
      kind: 'succeeded',
      value: { items: placed.slice(2), hasMore: false },
    });
    expect(await psp.listCharges({ createdAfter, startingAfter: `ch_${'0'.repeat(24)}` }, deadline)).toEqual({
      kind: 'refused',
      status: 400,
      detail: expect.stringContaining('startingAfter'),
    });
  });

  it('a bad createdAfter, limit or startingAfter, no filter at all, or a listing mixed with a lookup → 400 problem+json naming the field', async () => {
    const at = '2026-01-01T00:00:00.000Z';
    const { id: known } = await charge();
    const bad: [query: string, field: string][] = [
      ['', 'createdAfter'],
      ['limit=5', 'createdAfter'],
      [`startingAfter=${known}`, 'createdAfter'],
      ['createdAfter=', 'createdAfter'],
      ['createdAfter=yesterday', 'createdAfter'],
      ['createdAfter=2026-01-01', 'createdAfter'],
      ['createdAfter=2026-01-01T00:00:00', 'createdAfter'],
      ['createdAfter=2026-02-30T00:00:00Z', 'createdAfter'],
      ['createdAfter=2026-06-30T23:59:60Z', 'createdAfter'],
      ['createdAfter=0000-01-01T00:00:00Z', 'createdAfter'],
      [`createdAfter=${at}&createdAfter=${at}`, 'createdAfter'],
      [`createdAfter=${at}&limit=0`, 'limit'],
      [`createdAfter=${at}&limit=101`, 'limit'],
      [`createdAfter=${at}&limit=1.5`, 'limit'],
      [`createdAfter=${at}&limit=x`, 'limit'],
      [`createdAfter=${at}&limit=`, 'limit'],
      [`createdAfter=${at}&startingAfter=nope`, 'startingAfter'],
      [`createdAfter=${at}&startingAfter=${known.toUpperCase()}`, 'startingAfter'],
      // Well formed, but no such charge: a page after it cannot be told.
      [`createdAfter=${at}&startingAfter=ch_${'0'.repeat(24)}`, 'startingAfter'],
      [`createdAfter=${at}&orderId=${randomUUID()}`, 'createdAfter'],
      [`paymentId=${randomUUID()}&limit=5`, 'limit'],
    ];
    for (const [query, field] of bad) {
      const res = await request(t.url).get(`/psp/charges?${query}`).set('Authorization', PSP_AUTH);
      expect({ query, status: res.status, type: res.headers['content-type'] }).toEqual({
        query,
        status: 400,
        type: expect.stringMatching(/^application\/problem\+json/),
      });
      expect(res.body).toMatchObject({ type: 'urn:idempotent-orders:problem:validation-failed', status: 400 });
      expect({ query, fields: (res.body.errors as { field: string }[]).map((e) => e.field) }).toEqual({
        query,
        fields: expect.arrayContaining([field]),
      });
    }
    // The boundary values are fine.
    for (const limit of [1, 100]) expect((await get({ createdAfter: at, limit })).status).toBe(200);
  });

  it("needs the provider's key: none, or a client's API key, is 401 problem+json", async () => {
    const query = { createdAfter: '2026-01-01T00:00:00Z' };
    for (const res of [
      await request(t.url).get('/psp/charges').query(query),
      await request(t.url).get('/psp/charges').set('Authorization', bearer(ALICE)).query(query),
    ]) {
      expect(res.status).toBe(401);
      expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(res.body.type).toBe('urn:idempotent-orders:problem:unauthorized');
    }
  });
});
