// Secrets typed by the user: passwords and keys, read from the terminal
// without echo, or from the environment when scripted.
import { NimbleError } from '../protocol/errors.ts';

/**
 * The wallet password: $NIMBLE_PASSWORD when set, else typed at the terminal
 * without echo (twice with `confirm`). Without a terminal and without the
 * variable it fails rather than hang.
 */
export async function readPassword(question: string, opts: { confirm?: boolean } = {}): Promise<string> {
  const fromEnv = process.env.NIMBLE_PASSWORD;
  if (fromEnv !== undefined) return fromEnv;
  if (!process.stdin.isTTY) {
    throw new NimbleError('invalid', 'no password: set NIMBLE_PASSWORD or run the command in a terminal to type it');
  }
  const first = await readHidden(question);
  if (opts.confirm) {
    const second = await readHidden('Repeat the password: ');
    if (first !== second) throw new NimbleError('invalid', 'the two passwords differ; nothing was changed');
  }
  return first;
}

/**
 * A secret to import { NimbleError } from '../protocol/errors.ts';
import (private key or mnemonic): $NIMBLE_WALLET_SECRET, else
 * typed at the terminal without echo, else the first line of standard input.
 */
export async function readSecret(question: string): Promise<string> {
  const fromEnv = process.env.NIMBLE_WALLET_SECRET;
  if (fromEnv !== undefined) return fromEnv;
  if (process.stdin.isTTY) return readHidden(question);
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  const line = Buffer.concat(chunks).toString('utf8').split(/\r?\n/)[0] ?? '';
  if (!line.trim()) throw new NimbleError('invalid', 'no key given: pipe it on standard input or set NIMBLE_WALLET_SECRET');
  return line;
}

/** One line from the TTY in raw mode, nothing echoed. Ctrl-C cancels. */
function readHidden(question: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const stdin = process.stdin;
    process.stderr.write(question);
    stdin.setRawMode(true);
    stdin.resume();
    stdin.setEncoding('utf8');
    let value = '';
    const done = (err?: Error): void => {
      stdin.setRawMode(false);
      stdin.pause();
      stdin.removeListener('data', onData);
      process.stderr.write('\n');
      if (err) reject(err);
      else resolve(value);
    };
    const onData = (data: string): void => {
      for (const ch of data) {
        if (ch === '\r' || ch === '\n' || ch === '\u0004') return done();
        if (ch === '\u0003') return done(new NimbleError('invalid', 'cancelled'));
        if (ch === '\u007f' || ch === '\b') value = value.slice(0, -1);
        else value += ch;
      }
    };
    stdin.on('data', onData);
  });
}
