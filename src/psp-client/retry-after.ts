/**
 * The longest Retry-After we honour. A provider asking for more is down for longer than any
 * request of ours can wait (the deadline is a lease of about a minute), so the deadline check
 * gives up instead; the cap also keeps every delay far below setTimeout's 2^31-1 ms, past which
 * Node fires the timer at once.
 */
export const RETRY_AFTER_CAP_MS = 60_000;

const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
const MONTH = MONTHS.join('|');
const DAY = 'Mon|Tue|Wed|Thu|Fri|Sat|Sun';
const LONG_DAY = 'Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday';
// RFC 9110 §5.6.7: senders use IMF-fixdate; recipients must also accept the two obsolete forms.
const IMF_FIXDATE = new RegExp(`^(?:${DAY}), (\\d{2}) (${MONTH}) (\\d{4}) (\\d{2}):(\\d{2}):(\\d{2}) GMT$`);
const RFC850_DATE = new RegExp(`^(?:${LONG_DAY}), (\\d{2})-(${MONTH})-(\\d{2}) (\\d{2}):(\\d{2}):(\\d{2}) GMT$`);
const ASCTIME_DATE = new RegExp(`^(?:${DAY}) (${MONTH}) ([ \\d]\\d) (\\d{2}):(\\d{2}):(\\d{2}) (\\d{4})$`);

function utc(year: number, month: string, day: number, hour: number, minute: number, second: number): number | undefined {
  const m = MONTHS.indexOf(month);
  if (hour > 23 || minute > 59 || second > 60) return undefined;
  const time = Date.UTC(year, m, day, hour, minute, second);
  // Date.UTC rolls 31 Feb over into March: a date that does not exist is not a date.
  const check = new Date(time);
  if (check.getUTCFullYear() !== year || check.getUTCMonth() !== m || check.getUTCDate() !== day) return undefined;
  return time;
}

/**
 * An HTTP-date (RFC 9110 §5.6.7) as epoch ms, or undefined. Written out because Date.parse is
 * lenient in ways that matter here: it reads "5" as a date in 2001 and asctime as local time.
 */
export function parseHttpDate(text: string, now: number): number | undefined {
  let match = IMF_FIXDATE.exec(text);
  if (match) return utc(+match[3], match[2], +match[1], +match[4], +match[5], +match[6]);
  match = RFC850_DATE.exec(text);
  if (match) {
    // A two-digit year more than 50 years ahead means the most recent past year with those digits.
    const thisYear = new Date(now).getUTCFullYear();
    let year = thisYear - (thisYear % 100) + +match[3];
    if (year > thisYear + 50) year -= 100;
    return utc(year, match[2], +match[1], +match[4], +match[5], +match[6]);
  }
  match = ASCTIME_DATE.exec(text);
  if (match) return utc(+match[6], match[1], +match[2].trim(), +match[3], +match[4], +match[5]);
  return undefined;
}

/**
 * How long a Retry-After header asks us to wait, in ms from `now`, capped at RETRY_AFTER_CAP_MS;
 * undefined when absent or unreadable (then our own backoff decides). delta-seconds or HTTP-date;
 * a date in the past means "now".
 */
export function parseRetryAfter(value: string | null | undefined, now: number): number | undefined {
  if (value == null) return undefined;
  const text = value.trim();
  // Number() of a 400-digit string is Infinity: the cap still applies.
  if (/^\d+$/.test(text)) return Math.min(Number(text) * 1000, RETRY_AFTER_CAP_MS);
  const date = parseHttpDate(text, now);
  if (date === undefined) return undefined;
  return Math.min(Math.max(date - now, 0), RETRY_AFTER_CAP_MS);
}
