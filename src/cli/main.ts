#!/usr/bin/env node
// nbcli: the command line of Nimble Network (the program and its commands:
// ./program.ts). Runs the command line and turns errors into one line.
import { CommanderError } from 'commander';
import { NimbleError } from '../protocol/errors.ts';
import { buildProgram } from './program.ts';

async function main(argv: string[]): Promise<void> {
  try {
    await (await buildProgram(argv)).parseAsync(argv);
  } catch (err) {
    if (err instanceof CommanderError) {
      process.exitCode = err.exitCode;
      return;
    }
    const message = err instanceof Error ? err.message : String(err);
    process.stderr.write(`nbcli: ${message}\n`);
    if (!(err instanceof NimbleError && err.isClientError) && process.env.NIMBLE_DEBUG) console.error(err);
    process.exitCode = 1;
  }
}

await main(process.argv);
