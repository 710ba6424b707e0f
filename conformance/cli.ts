#!/usr/bin/env node
/**
 * npx idempotency-key-conformance --config my-api.json [--json]
 * Black-box checks of an Idempotency-Key API (README.md; each check explained in CHECKS.md, both in the package).
 * Exit 0: no check failed; 1: a check failed; 2: the config or the run is broken; 3: inconclusive.
 */
import { BrokenRun } from './checks.js';
import { ConfigError, parseArgs, resolveTarget, USAGE } from './config.js';
import { exitCodeOf, runConformance } from './kit.js';
import { formatTable, toJson, useColour } from './report.js';

async function main(): Promise<number> {
  const argv = process.argv.slice(2);
  if (argv.includes('--help') || argv.length === 0) {
    console.log(USAGE);
    return argv.length === 0 ? 2 : 0;
  }
  const { config, json } = parseArgs(argv);
  const target = resolveTarget(config);
  // Progress on stderr, so stdout holds only the table or the JSON.
  const report = await runConformance(target, (r) => void process.stderr.write(`${r.outcome.padEnd(6)} ${r.id}\n`));
  console.log(json ? toJson(report) : formatTable(report, useColour(process.stdout)));
  return exitCodeOf(report);
}

main().then(
  (code) => (process.exitCode = code),
  (err: unknown) => {
    console.error(err instanceof ConfigError || err instanceof BrokenRun ? `conformance: ${err.message}` : err);
    process.exitCode = 2;
  },
);
