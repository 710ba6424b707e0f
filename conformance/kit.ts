import { CHECKS, type CheckResult, runCheck } from './checks.js';
import type { Target } from './config.js';
import { HttpClient } from './http.js';

export interface KitReport {
  base: string;
  operation: string;
  results: CheckResult[];
  summary: { pass: number; fail: number; choice: number; 'n/a': number };
}

/** Runs every check (or `target.only`) in order against the target, one at a time. */
export async function runConformance(target: Target, onResult: (result: CheckResult) => void = () => undefined): Promise<KitReport> {
  const unknown = (target.only ?? []).filter((id) => !CHECKS.some((c) => c.id === id));
  if (unknown.length > 0) throw new Error(`unknown check id(s): ${unknown.join(', ')} (known: ${CHECKS.map((c) => c.id).join(', ')})`);
  const http = new HttpClient(target.base, target.parallel, target.timeoutMs);
  const results: CheckResult[] = [];
  try {
    for (const check of CHECKS) {
      if (target.only && !target.only.includes(check.id)) continue;
      const result = await runCheck(check, target, http);
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
    summary: { pass: count('pass'), fail: count('fail'), choice: count('choice'), 'n/a': count('n/a') },
  };
}
