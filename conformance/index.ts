// The kit as a library: run the checks from your own tests, with your own kill/start/arm functions.
export { BrokenRun, CHECKS, type CheckResult, type Outcome } from './checks.js';
export { type Caller, ConfigError, type KitConfig, parseArgs, resolveTarget, type Target, validateConfig } from './config.js';
export { exitCodeOf, type KitReport, runConformance } from './kit.js';
export { formatTable, toJson } from './report.js';
