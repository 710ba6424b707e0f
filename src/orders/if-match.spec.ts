import { parseIfMatch } from './if-match.js';
import { ProblemException } from '#service-kit';

function problemOf(header: string | undefined) {
  try {
    parseIfMatch(header);
  } catch (err) {
    if (err instanceof ProblemException) return err.problem;
    throw err;
  }
  throw new Error(`parseIfMatch(${header}) did not throw`);
}

describe('parseIfMatch', () => {
  test.each<[string, number[]]>([
    ['"3"', [3]],
    ['  "3"  ', [3]],
    ['"1", "2",   "3"', [1, 2, 3]],
    ['"7",,"8",', [7, 8]],
    ['"2147483647"', [2147483647]],
    // Valid entity-tags that can never match a version: dropped, so the update fails as stale (412).
    ['W/"3"', []],
    ['"abc"', []],
    ['"0"', []],
    ['"03"', []],
    ['"2147483648"', []],
    ['"a,b", "4"', [4]],
    ['W/"1", "5"', [5]],
  ])('%s → %j', (header, versions) => {
    expect(parseIfMatch(header)).toEqual(versions);
  });

  test.each([undefined, '', '   ', '*'])('%j → 428', (header) => {
    expect(problemOf(header)).toMatchObject({ status: 428, type: 'urn:idempotent-orders:problem:precondition-required' });
  });

  test.each(['3', '"3', '3"', '"3" "4"', '"3";', 'W/3', 'w/"3"', '"3", *', "'3'", '"a"b"'])('%s → 400', (header) => {
    expect(problemOf(header)).toMatchObject({ status: 400, type: 'urn:idempotent-orders:problem:invalid-if-match' });
  });
});
