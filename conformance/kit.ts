import { BrokenRun, CHECKS, type CheckResult, type RunState, runCheck } from './checks.js';
import { ConfigError, type Target, unknownChecks } from './config.js';
import { HttpClient, probe } from './http.js';

export interface KitReport {
  base: string;
  operation: string;
  results: CheckResult[];
  summary: { pass: number; fail: number; choice: number; 'n/a': number; inconclusive: number; broken: number };
}

/**
 * The CLI's exit code: 2 when the run could not test (a check broken: the config part to fix is named), else 1 when a
 * check failed, else 3 when one was inconclusive (it ran but could not provoke what it tests), else 0.
 */
export function exitCodeOf(report: KitReport): number {
  const { broken, fail, inconclusive } = report.summary;
  return broken > 0 ? 2 : fail > 0 ? 1 : inconclusive > 0 ? 3 : 0;
}

/** Runs every check (or `target.only`) in order against the target, one at a time. */
export async function runConformance(target: Target, onResult: (result: CheckResult) => void = () => undefined): Promise<KitReport> {
  const unknown = (target.only ?? []).filter((id) => !CHECKS.some((c) => c.id === id));
  if (unknown.length > 0) throw new ConfigError(unknownChecks(unknown));
  // A target that is not there fails nothing: the run is broken, and says which part of the config to look at.
  const reachable = await probe(target.base);
  if (reachable !== 'open')
    throw new BrokenRun('base', `base ${target.base.href} is not answering (${reachable}): start the API, or fix base`);
  const http = new HttpClient(target.base, target.parallel, target.timeoutMs);
  const results: CheckResult[] = [];
  const run: RunState = {};
  try {
    for (const check of CHECKS) {
      if (target.only && !target.only.includes(check.id)) continue;
      const result = await runCheck(check, target, http, run);
      results.push(result);
      onResult(result);
    }
  } finally {
    http.close();
  }
  const count = (o: CheckResult['outcome']) => results.filter((r) => r.outcome === o).length;
  return {
    base: target.base.href,
    operation: `${target.operation.method} ${target.operation.path}`,
    results,
    summary: {
      pass: count('pass'),
      fail: count('fail'),
      choice: count('choice'),
      'n/a': count('n/a'),
      inconclusive: count('inconclusive'),
      broken: count('broken'),
    },
  };
}
