// What every nbcli command shares: --data-dir and --json, where data lives,
// how results are printed, and how a user error ends a command.
import { homedir } from 'node:os';
import { join, resolve } from 'node:path';
import type { Command } from 'commander';
import { NimbleError } from '../protocol/errors.ts';

export interface CommonOptions {
  dataDir?: string;
  json?: boolean;
}

/** Adds --data-dir and --json to a command. */
export function withCommonOptions(cmd: Command): Command {
  return cmd
    .option('--data-dir <dir>', 'where nbcli keeps its state (default: $NIMBLE_HOME or ~/.nimble)')
    .option('--json', 'print machine-readable JSON instead of the human view');
}

/** The data directory: --data-dir, else $NIMBLE_HOME, else ~/.nimble. */
export function resolveDataDir(opts: CommonOptions): string {
  if (opts.dataDir) return resolve(opts.dataDir);
  if (process.env.NIMBLE_HOME) return resolve(process.env.NIMBLE_HOME);
  return join(homedir(), '.nimble');
}

/** Prints `value` as one JSON line with --json, else the human text. */
export function emit(opts: CommonOptions, value: unknown, human: () => string): void {
  if (opts.json) process.stdout.write(JSON.stringify(value) + '\n');
  else process.stdout.write(human() + '\n');
}

/** Parses a positive integer flag or throws an 'invalid' NimbleError naming it. */
export function parsePositiveInt(name: string, value: string | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n <= 0) throw new NimbleError('invalid', `${name} must be a positive integer, got '${value}'`);
  return n;
}

const BYTE_UNITS: Record<string, number> = { '': 1, b: 1, kb: 1e3, mb: 1e6, gb: 1e9, tb: 1e12, kib: 2 ** 10, mib: 2 ** 20, gib: 2 ** 30, tib: 2 ** 40 };

/** Parses an amount of memory such as `512MB`, `2GiB` or `1000000` (bytes) or throws an 'invalid' NimbleError naming the flag. */
export function parseBytes(name: string, value: string): number {
  const m = /^([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)$/.exec(value.trim());
  const unit = m ? BYTE_UNITS[m[2].toLowerCase()] : undefined;
  const n = m && unit ? Math.floor(Number(m[1]) * unit) : NaN;
  if (!(n >= 1 && n <= 2 ** 50)) throw new NimbleError('invalid', `${name} must be an amount of memory such as 512MB or 2GiB (at least 1 byte, at most 1 PiB), got '${value}'`);
  return n;
}

/** The orchestrator commands talk to unless told: $NIMBLE_ORCHESTRATOR, else the default port on this machine. */
export const DEFAULT_ORCHESTRATOR = process.env.NIMBLE_ORCHESTRATOR ?? 'http://127.0.0.1:7070';

/** Resolves on SIGINT or SIGTERM. */
export function waitForSignal(): Promise<string> {
  return new Promise((resolve) => {
    const on = (sig: string): void => {
      process.off('SIGINT', on);
      process.off('SIGTERM', on);
      resolve(sig);
    };
    process.on('SIGINT', on);
    process.on('SIGTERM', on);
  });
}
