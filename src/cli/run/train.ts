// nbcli train --local: train a model in this process with a progress bar,
// report the held-out loss, write a checkpoint and print a generated sample.
import { NimbleError } from '../../protocol/errors.ts';
import { join } from 'node:path';
import type { Command } from 'commander';
import { loadCorpus } from '../../data/corpus.ts';
import { Engine } from '../../engine/engine.ts';
import { saveStage } from '../../model/checkpoint.ts';
import { gptConfig } from '../../model/config.ts';
import { generateFromStage } from '../../inference/generate.ts';
import { trainLocal } from '../../train/local.ts';
import { DEFAULT_ORCHESTRATOR, emit, parsePositiveInt, resolveDataDir, withCommonOptions, type CommonOptions } from '../common.ts';
import { describeRun, followRun } from './follow.ts';
import { DEVELOPER_KEY_FILE, signingKey } from '../keys.ts';
import { ProgressBar } from '../progress.ts';
import { OrchestratorClient } from '../../api/client.ts';

interface TrainFlags extends CommonOptions {
  'wallet.name'?: string;
  local?: boolean;
  orchestrator: string;
  stages?: string;
  mergeEvery?: string;
  follow?: boolean;
  model: string;
  data: string;
  steps?: string;
  batch?: string;
  lr?: string;
  seed?: string;
  threads?: string;
  evalBatches?: string;
  sampleLength?: string;
  out?: string;
}

export function registerTrain(program: Command): void {
  withCommonOptions(
    program
      .command('train')
      .description('train a model on the network (or with --local: in this process, on every core)')
      .option('--local', 'train in this process instead of on the network')
      .option('--orchestrator <url>', 'the network to train on', DEFAULT_ORCHESTRATOR)
      .option('--stages <n>', 'pipeline stages (default: chosen from the miners available)')
      .option('--merge-every <h>', 'inner steps per replica between merges (network)')
      .option('--follow', 'show the run\'s progress until it ends (network)')
      .option('--wallet.name <name>', 'sign the run as this wallet (default: <data-dir>/developer-key.json, made on first use)')
      .option('--model <name>', 'model config (gpt-tiny, gpt-small, gpt-micro)', 'gpt-tiny')
      .option('--data <name|file>', "'moby-dick' or the path of a text file", 'moby-dick')
      .option('--steps <n>', 'optimizer steps', '2000')
      .option('--batch <n>', 'sequences per step', '12')
      .option('--lr <x>', 'AdamW learning rate', '0.001')
      .option('--seed <n>', 'initialisation and batch seed', '1337')
      .option('--threads <n>', 'engine threads (default: every core)')
      .option('--eval-batches <n>', 'held-out batches averaged for the final loss', '200')
      .option('--sample-length <n>', 'bytes of text to generate at the end', '200')
      .option('--out <file>', 'checkpoint path (default: <data-dir>/checkpoints/<model>-<time>.safetensors)'),
  ).action(async (flags: TrainFlags) => {
    if (flags.local) await runLocal(flags);
    else await runOnNetwork(flags);
  });
}

async function runOnNetwork(flags: TrainFlags): Promise<void> {
  gptConfig(flags.model);
  const request = {
    model: flags.model,
    data: flags.data,
    steps: parsePositiveInt('--steps', flags.steps, 2000),
    batchSize: parsePositiveInt('--batch', flags.batch, 12),
    seed: parsePositiveInt('--seed', flags.seed, 1337),
    lr: Number(flags.lr ?? '0.001'),
    ...(flags.stages ? { stages: parsePositiveInt('--stages', flags.stages, 1) } : {}),
    ...(flags.mergeEvery ? { mergeEvery: parsePositiveInt('--merge-every', flags.mergeEvery, 50) } : {}),
  };
  const api = new OrchestratorClient(flags.orchestrator, { wallet: await signingKey(flags, DEVELOPER_KEY_FILE) });
  const run = await api.createRun(request);
  emit(flags, { event: 'created', id: run.id, status: run.status }, () => run.id);
  if (!flags.follow) return;
  const done = await followRun(api, run.id, Boolean(flags.json));
  if (!flags.json) process.stdout.write(`${done.id} ${done.status}: ${describeRun(done)}\n`);
  if (done.status !== 'completed') throw new NimbleError('conflict', `run ${done.id} ${done.status}: ${done.message ?? 'unknown error'}`);
}

async function runLocal(flags: TrainFlags): Promise<void> {
  gptConfig(flags.model); // validate the name before the slow parts
  const steps = parsePositiveInt('--steps', flags.steps, 2000);
  const batchSize = parsePositiveInt('--batch', flags.batch, 12);
  const seed = parsePositiveInt('--seed', flags.seed, 1337);
  const evalBatches = parsePositiveInt('--eval-batches', flags.evalBatches, 200);
  const sampleLength = parsePositiveInt('--sample-length', flags.sampleLength, 200);
  const threads = flags.threads === undefined ? undefined : parsePositiveInt('--threads', flags.threads, 1);
  const lr = Number(flags.lr ?? '0.001');
  if (!(lr > 0 && lr < 1)) throw new NimbleError('invalid', `--lr must be a number in (0, 1), got '${flags.lr}'`);
  let corpus;
  try {
    corpus = loadCorpus(flags.data);
  } catch (err) {
    throw new NimbleError('invalid', (err as Error).message);
  }
  const engine = await Engine.create({ threads });
  try {
    const bar = new ProgressBar('train');
    if (!flags.json) {
      process.stderr.write(
        `training ${flags.model} on ${corpus.name} (${corpus.train.length} bytes, ${corpus.heldout.length} held out), ` +
          `${steps} steps of ${batchSize}×${gptConfig(flags.model).contextLength} tokens, ${engine.threads} threads` +
          `${engine.relaxedSimd ? ', relaxed SIMD' : ''}\n`,
      );
    }
    const result = trainLocal(engine, {
      model: flags.model,
      corpus,
      steps,
      batchSize,
      seed,
      evalBatches,
      optimizer: { lr },
      onStep: (s) => {
        if (flags.json) {
          if (s.step % 50 === 0 || s.step === s.steps) process.stdout.write(JSON.stringify({ event: 'step', ...s }) + '\n');
          return;
        }
        bar.update({
          done: s.step,
          total: s.steps,
          elapsedMs: s.elapsedMs,
          text: `loss ${s.loss.toFixed(4)} ${Math.round(s.tokensPerSecond).toLocaleString('en-US')} tok/s`,
        });
      },
    });
    const out = flags.out ?? join(resolveDataDir(flags), 'checkpoints', `${flags.model}-${new Date().toISOString().replace(/[:.]/g, '-')}.safetensors`);
    saveStage(result.stage, out, steps);
    const prompt = 'Call me Ishmael. ';
    const sample = generateFromStage(engine, result.stage, prompt, { maxTokens: sampleLength, temperature: 0.8, seed });
    const summary = {
      event: 'done',
      model: flags.model,
      steps,
      finalLoss: result.finalLoss,
      heldoutLoss: result.heldoutLoss,
      tokensPerSecond: result.tokensPerSecond,
      seconds: result.elapsedMs / 1000,
      checkpoint: out,
      sample: prompt + sample.text,
    };
    emit(flags, summary, () =>
      [
        `final training loss ${result.finalLoss.toFixed(4)}, held-out loss ${result.heldoutLoss.toFixed(4)} nats/byte (${evalBatches} batches)`,
        `${Math.round(result.tokensPerSecond).toLocaleString('en-US')} tokens/s (median), ${(result.elapsedMs / 1000).toFixed(1)} s`,
        `checkpoint: ${out}`,
        `sample:\n${summary.sample}`,
      ].join('\n'),
    );
    result.stage.release();
  } finally {
    await engine.close();
  }
}
