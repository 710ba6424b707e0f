#!/usr/bin/env node
/**
 * node conformance/dist/cli.js --config my-api.json [--json]   (npx idempotency-key-conformance once published)
 * Black-box checks of an Idempotency-Key API (conformance/README.md; each check explained in docs/conformance.md).
 * Exit 0: no check failed; 1: a check failed; 2: the config or the run itself is broken.
 */
import { ConfigError, parseArgs, resolveTarget, USAGE } from './config.js';
import { runConformance } from './kit.js';
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
  return report.summary.fail > 0 ? 1 : 0;
}

main().then(
  (code) => (process.exitCode = code),
  (err: unknown) => {
    console.error(err instanceof ConfigError ? `conformance: ${err.message}` : err);
    process.exitCode = 2;
  },
);
