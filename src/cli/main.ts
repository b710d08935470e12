#!/usr/bin/env node
// nbcli: the command line of Nimble Network. Each command group lives in its
// own module under src/cli/ and registers itself here.
import { Command, CommanderError } from 'commander';
import { NimbleError } from '../protocol/errors.ts';
import { registerTrain } from './train.ts';
import { registerWallet } from './wallet.ts';
import { registerStake } from './stake.ts';
import { registerOrchestrator } from './orchestrator.ts';
import { registerMiner } from './miner.ts';
import { registerUp } from './up.ts';
import { registerRewards } from './rewards.ts';
import { registerRun } from './run.ts';
import { registerJob } from './job.ts';
import { registerCheckpoint } from './checkpoint.ts';
import { registerModel } from './model.ts';
import { registerDataset } from './dataset.ts';
import { registerGenerate } from './generate.ts';
import { registerApiKey } from './api-key.ts';
import { registerCredit } from './credit.ts';
import { registerSimulate } from './simulate.ts';

export function buildProgram(): Command {
  const program = new Command('nbcli')
    .description('Nimble Network: train and serve AI models on machines nobody owns together')
    .version('0.1.0')
    .showHelpAfterError()
    .exitOverride();
  registerTrain(program);
  registerWallet(program);
  registerStake(program);
  registerOrchestrator(program);
  registerMiner(program);
  registerUp(program);
  registerRewards(program);
  registerRun(program);
  registerJob(program);
  registerCheckpoint(program);
  registerModel(program);
  registerDataset(program);
  registerGenerate(program);
  registerApiKey(program);
  registerCredit(program);
  registerSimulate(program);
  return program;
}

async function main(argv: string[]): Promise<void> {
  try {
    await buildProgram().parseAsync(argv);
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
