import { ProblemException } from '#service-kit';

/** Versions fit PostgreSQL's integer column; a larger number can name no version. */
const MAX_VERSION = 2_147_483_647;

/** One entity-tag (RFC 9110 §8.8.3) and the list separator after it. etagc allows commas, so the list is tokenised, not split. */
const ENTITY_TAG = /^[ \t]*(W\/)?"([\x21\x23-\x7E\x80-\xFF]*)"[ \t]*(,|$)/;

/**
 * The order versions an `If-Match` header accepts (the ETag is `"<version>"`).
 * - missing, blank or `*` → 428: `*` matches whatever version is current, so it cannot prevent a lost update;
 * - not a list of entity-tags (e.g. `3` without quotes) → 400;
 * - weak tags (`W/"3"`) and tags that are not a version are valid but never match (If-Match compares strongly),
 *   so they are dropped: a header of only those yields [] and the update answers 412 with the current ETag.
 */
export function parseIfMatch(header: string | undefined): number[] {
  const value = header?.trim() ?? '';
  if (value === '' || value === '*') {
    throw ProblemException.of(
      428,
      'precondition-required',
      'Precondition required',
      value === '*'
        ? 'If-Match: * does not say which version you read: send the ETag of your last read, e.g. If-Match: "3".'
        : 'This update needs If-Match with the ETag of your last read of the order, e.g. If-Match: "3".',
    );
  }
  const versions: number[] = [];
  let rest = value;
  while (rest !== '') {
    // Empty list elements (", ,") are allowed by RFC 9110 §5.6.1.2.
    const empty = /^[ \t]*,/.exec(rest);
    if (empty) {
      rest = rest.slice(empty[0].length);
      continue;
    }
    const tag = ENTITY_TAG.exec(rest);
    if (!tag) {
      throw ProblemException.of(
        400,
        'invalid-if-match',
        'Invalid If-Match',
        'If-Match must be a list of quoted ETags, e.g. If-Match: "3".',
      );
    }
    const [, weak, opaque] = tag;
    if (!weak && /^[1-9]\d{0,9}$/.test(opaque) && Number(opaque) <= MAX_VERSION) versions.push(Number(opaque));
    rest = rest.slice(tag[0].length);
  }
  return versions;
}

/** An order's ETag: its version, which changes on every write, as a strong entity-tag. */
export const versionEtag = (version: number) => `"${version}"`;
