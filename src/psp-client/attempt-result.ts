/**
 * What one HTTP attempt gave, judged at once so that the retry, the breaker and the caller's
 * result all read the same verdict:
 * - definitive: the provider answered and recorded an outcome (201 or 402 for writes, a 200 for lookups);
 * - refused: the provider refused the request itself and recorded nothing (400, 404, 422);
 * - unknown: anything else. For a write it MAY have been recorded: the caller must ask again with the same key.
 */
export type Verdict = 'definitive' | 'refused' | 'unknown';

export type AttemptResult =
  | { kind: 'response'; status: number; body: unknown; retryAfterMs: number | undefined; verdict: Verdict }
  | { kind: 'timeout' | 'network'; message: string; verdict: 'unknown' }
  /** Not sent: the deadline or the breaker left no room for this attempt (see PspClient). */
  | { kind: 'skipped'; verdict: 'unknown' };

/** The provider refused the request itself: nothing was recorded, and the same request would be refused again. */
export const REFUSED_STATUSES: readonly number[] = [400, 404, 422];

/**
 * Statuses worth another attempt under the same key: 409 (the same key is still in flight at the
 * provider), 429 (rate limited) and 5xx. Any other status is an answer that repeating will not change.
 */
export function isRetryableStatus(status: number): boolean {
  return status === 409 || status === 429 || (status >= 500 && status <= 599);
}

/** Network errors and timeouts carry no answer at all, so another attempt may get one. */
export function isRetryable(result: AttemptResult): boolean {
  switch (result.kind) {
    case 'response':
      return isRetryableStatus(result.status);
    case 'timeout':
    case 'network':
      return true;
    case 'skipped':
      return false;
  }
}

/**
 * A write (charge, refund): 201 with a succeeded record or 402 with a failed one is definitive; a
 * 201 or 402 whose body is not the record it should be is unknown (recorded, maybe, but unreadable).
 */
export function judgeWrite(status: number, body: unknown, isRecord: (body: unknown) => body is { status: string }): Verdict {
  if (status === 201) return isRecord(body) && body.status === 'succeeded' ? 'definitive' : 'unknown';
  if (status === 402) return isRecord(body) && body.status === 'failed' ? 'definitive' : 'unknown';
  return REFUSED_STATUSES.includes(status) ? 'refused' : 'unknown';
}

/** What a lookup answers: its records, and whether more follow (a listing's pages; a lookup by id has them all). */
export interface LookupPage<T> {
  items: T[];
  hasMore: boolean;
}

/** A lookup: only a 200 that `read` can read is an answer ("none" is an answer, "unreadable" is not). */
export function judgeLookup(status: number, body: unknown, read: (body: unknown) => LookupPage<unknown> | undefined): Verdict {
  if (status === 200) return read(body) ? 'definitive' : 'unknown';
  return REFUSED_STATUSES.includes(status) ? 'refused' : 'unknown';
}

/** A lookup by id: `{items}`, every item a record. It answers every match, so hasMore is not read. */
export function readLookup<T>(body: unknown, isItem: (item: unknown) => item is T): LookupPage<T> | undefined {
  if (typeof body !== 'object' || body === null) return undefined;
  const items = (body as { items?: unknown }).items;
  return Array.isArray(items) && items.every(isItem) ? { items, hasMore: false } : undefined;
}

/** A page of a listing: as a lookup's, and hasMore must be there, or where the listing ends cannot be told. */
export function readListing<T>(body: unknown, isItem: (item: unknown) => item is T): LookupPage<T> | undefined {
  const page = readLookup(body, isItem);
  const hasMore = (body as { hasMore?: unknown } | undefined)?.hasMore;
  return page && typeof hasMore === 'boolean' ? { items: page.items, hasMore } : undefined;
}

/** For logs and `unknown` reasons: what the attempt ended with. */
export function describeAttempt(result: AttemptResult | undefined): string {
  if (!result) return 'no attempt was made';
  switch (result.kind) {
    case 'response':
      return `HTTP ${result.status}`;
    case 'timeout':
    case 'network':
      return `${result.kind}: ${result.message}`;
    case 'skipped':
      return 'not sent';
  }
}
