import type { CheckResult } from './checks.js';
import type { Exchange } from './http.js';
import type { KitReport } from './kit.js';

const BODY_SHOWN = 300;

/** Colour only on a terminal, and never with NO_COLOR set (https://no-color.org). */
export function useColour(stream: NodeJS.WriteStream): boolean {
  return Boolean(stream.isTTY) && !process.env.NO_COLOR;
}

const paint = (on: boolean, code: number, text: string) => (on ? `\x1b[${code}m${text}\x1b[0m` : text);
const LABEL = {
  pass: ['PASS', 32],
  fail: ['FAIL', 31],
  'n/a': ['N/A', 33],
  choice: ['CHOICE', 36],
  inconclusive: ['INCONCL', 35],
  broken: ['BROKEN', 31],
} as const;

function shorten(text: string): string {
  const one = text.replace(/\s+/g, ' ');
  return one.length > BODY_SHOWN ? `${one.slice(0, BODY_SHOWN)}… (${text.length} chars)` : one;
}

/** Credentials in a report (CI logs) are shown by their scheme and length only. */
const CREDENTIAL = /^(authorization|proxy-authorization|cookie)$|api-?key|token|secret/i;

function redacted(name: string, value: string): string {
  if (!CREDENTIAL.test(name)) return value;
  const [scheme, rest] = value.includes(' ') ? [value.slice(0, value.indexOf(' ')), value.slice(value.indexOf(' ') + 1)] : ['', value];
  return `${scheme ? `${scheme} ` : ''}<${rest.length} characters>`;
}

function sentHeaders(x: Exchange): Record<string, string | string[]> {
  return Object.fromEntries(
    Object.entries(x.sent.headers).map(([name, value]) => [name, Array.isArray(value) ? value : redacted(name, value)]),
  );
}

/** What was sent and what came back, as a reader needs it: the key and caller headers, the status, the headers that matter. */
export function describeExchange(x: Exchange): string[] {
  const headers = Object.entries(sentHeaders(x))
    .filter(([name]) => name.toLowerCase() !== 'content-type')
    .flatMap(([name, value]) => (Array.isArray(value) ? value : [value]).map((v) => `${name}: ${shorten(v)}`));
  const lines = [`sent: ${x.sent.method} ${x.sent.path} ${headers.join(' | ')}`, `      ${shorten(x.sent.body ?? '')}`];
  if (!x.answer) return [...lines, `got:  no answer (${x.error})`];
  const shown = Object.entries(x.answer.headers)
    .filter(([name]) => /^(content-type|location|etag|retry-after)$|replay|idempot/i.test(name))
    .map(([name, value]) => `${name}: ${value}`);
  return [...lines, `got:  ${x.answer.status} ${shown.join(' | ')}`, `      ${shorten(x.answer.body.toString('utf8'))}`];
}

/** The table a person reads: one row per check, the evidence under each failure. */
export function formatTable(report: KitReport, colour: boolean): string {
  const width = Math.max(...report.results.map((r) => r.id.length));
  const rows = report.results.flatMap((r: CheckResult) => {
    const [label, code] = LABEL[r.outcome];
    const out = [`${paint(colour, code, label.padEnd(7))}  ${r.id.padEnd(width)}  ${r.detail}`];
    for (const note of r.notes) out.push(`${' '.repeat(width + 11)}note: ${note}`);
    for (const x of r.outcome === 'pass' ? [] : r.evidence) out.push(...describeExchange(x).map((l) => `${' '.repeat(width + 11)}${l}`));
    return out;
  });
  const { pass, fail, broken, inconclusive } = report.summary;
  const extra = [
    broken > 0 && `${broken} broken (the run could not test: fix the part named)`,
    inconclusive > 0 && `${inconclusive} inconclusive`,
  ]
    .filter(Boolean)
    .map((t) => `, ${t}`)
    .join('');
  const tail = `${pass} passed, ${fail} failed, ${report.summary.choice} design choice(s), ${report.summary['n/a']} not applicable${extra} — ${report.operation} at ${report.base}`;
  return [...rows, '', paint(colour, fail + broken > 0 ? 31 : inconclusive > 0 ? 35 : 32, tail)].join('\n');
}

/** For CI: bodies as text, evidence only where it explains a failure. */
export function toJson(report: KitReport): string {
  return JSON.stringify(
    {
      ...report,
      results: report.results.map((r) => ({
        ...r,
        evidence: r.evidence.map((x) => ({
          sent: { ...x.sent, headers: sentHeaders(x) },
          got: x.answer ? { status: x.answer.status, headers: x.answer.headers, body: x.answer.body.toString('utf8') } : { error: x.error },
        })),
      })),
    },
    null,
    2,
  );
}
