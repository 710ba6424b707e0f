import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

/**
 * The fulfilment consumer as its own process, as `npm run start:fulfilment` runs it (its defaults, `env` on top);
 * resolves once it listens, with its start-up banner, and rejects if it exits first. Shared by the broker benches.
 */
export async function startConsumer(env: Record<string, string>): Promise<{ child: ChildProcess; banner: string }> {
  const child = spawn(process.execPath, [fileURLToPath(new URL('../apps/fulfilment/src/main.js', import.meta.url))], {
    env: { PATH: process.env.PATH ?? '', PORT: '0', ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let output = '';
  await new Promise<void>((resolve, reject) => {
    child.stdout.on('data', (chunk: Buffer) => {
      output += chunk.toString();
      if (output.includes('fulfilment listening on')) resolve();
    });
    child.once('exit', (code) => reject(new Error(`the consumer exited ${code}:\n${output}`)));
  });
  return { child, banner: output.slice(output.indexOf('fulfilment listening on')).trim() };
}
