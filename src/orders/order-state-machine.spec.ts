import { ORDER_STATUSES, type OrderStatus } from './order-status.js';
import { allowedFrom, canTransition, nextStatuses } from './order-state-machine.js';

// Written out from docs/contract.md#orders, independently of the table under test.
const LEGAL = new Set(['created>paid', 'created>cancelled', 'paid>shipped', 'paid>cancelled', 'shipped>delivered', 'cancelled>refunded']);

const pairs = ORDER_STATUSES.flatMap((from) => ORDER_STATUSES.map((to) => [from, to, LEGAL.has(`${from}>${to}`)] as const));

describe('order state machine', () => {
  it('covers all 36 pairs', () => {
    expect(pairs).toHaveLength(36);
  });

  test.each(pairs)('%s → %s allowed: %s', (from, to, legal) => {
    expect(canTransition(from, to)).toBe(legal);
    expect(nextStatuses(from).includes(to)).toBe(legal);
    expect(allowedFrom(to).includes(from)).toBe(legal);
  });

  test.each<[OrderStatus, OrderStatus[]]>([
    ['created', []],
    ['paid', ['created']],
    ['cancelled', ['created', 'paid']],
    ['shipped', ['paid']],
    ['delivered', ['shipped']],
    ['refunded', ['cancelled']],
  ])('%s is reached from %j', (target, from) => {
    expect(allowedFrom(target)).toEqual(from);
  });

  it('only delivered and refunded are final', () => {
    expect(ORDER_STATUSES.filter((status) => nextStatuses(status).length === 0)).toEqual(['delivered', 'refunded']);
  });

  it('never allows staying in place', () => {
    for (const status of ORDER_STATUSES) expect(canTransition(status, status)).toBe(false);
  });
});
