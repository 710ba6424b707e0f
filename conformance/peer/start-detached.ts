/**
 * A start command for the crash check: starts `node <entry>` in the background with the environment in
 * <env file> (a JSON object), writes its pid to <pid file>, and returns once <ready URL> answers.
 *   node dist/conformance/peer/start-detached.js <entry.js> <env file> <pid file> <ready URL> <log file>
 */
import { spawn } from 'node:child_process';
import { openSync, readFileSync, writeFileSync } from 'node:fs';
import { waitUntilAnswering } from '../config.js';

const [entry, envFile, pidFile, readyUrl, logFile] = process.argv.slice(2);
if (!logFile) throw new Error('usage: start-detached.js <entry.js> <env file> <pid file> <ready URL> <log file>');
const out = openSync(logFile, 'a');
const env = { PATH: process.env.PATH, ...(JSON.parse(readFileSync(envFile, 'utf8')) as Record<string, string>) };
const child = spawn(process.execPath, [entry], { env, stdio: ['ignore', out, out], detached: true });
writeFileSync(pidFile, String(child.pid));
child.unref();
// An app that exits (a taken port, a bad setting) fails the start at once, not after the ready deadline.
const exited = new Promise<never>((_, reject) =>
  child.once('exit', (code, signal) => reject(new Error(`it exited (${signal ?? code}) before answering`))),
);
try {
  await Promise.race([waitUntilAnswering(new URL(readyUrl)), exited]);
} catch (err) {
  child.kill('SIGKILL');
  throw new Error(`${entry} is not up (see ${logFile})`, { cause: err });
}
