// `nbcli job run FILE --local`: the proof of concept of a job, in this
// process, on the code the network runs (the same data loading, model, and
// checkpoint format): a GPT on its corpus with a held-out loss and a
// checkpoint, or the spam classifier with held-out accuracy beside its
// logistic-regression baseline.
import { dirname, join } from 'node:path';
import { loadLocalCorpus } from '../../data/dataset.ts';
import { Engine } from '../../engine/engine.ts';
import { resolveJobSpec, type JobSpec } from '../../jobs/spec.ts';
import { saveStage } from '../../model/checkpoint.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { trainClassifierLocal } from '../../train/classifier.ts';
import { trainLocal } from '../../train/local.ts';
import { emit, parsePositiveInt, resolveDataDir, type CommonOptions } from '../common.ts';
import { ProgressBar } from '../progress.ts';

/** Steps a proof of concept runs unless told (the spec's, at most this). */
export const LOCAL_STEPS = 100;

export interface LocalFlags extends CommonOptions {
  steps?: string;
  threads?: string;
  out?: string;
  /** the spec file: a relative data path is taken from its folder (default: the current folder) */
  specFile?: string;
}

export async function runJobLocally(spec: JobSpec, flags: LocalFlags): Promise<void> {
  const job = resolveJobSpec(spec);
  const steps = parsePositiveInt('--steps', flags.steps, Math.min(job.steps, LOCAL_STEPS));
  const threads = flags.threads === undefined ? undefined : parsePositiveInt('--threads', flags.threads, 1);
  const engine = await Engine.create({ threads });
  const bar = new ProgressBar(job.name);
  try {
    if (job.model.kind === 'mlp') {
      const result = trainClassifierLocal(engine, {
        hidden: job.model.hidden,
        steps,
        batchSize: job.batchSize,
        learningRate: job.learningRate,
        seed: job.seed,
        onStep: (s) => flags.json || bar.update({ done: s.step, total: s.steps, elapsedMs: s.elapsedMs, text: `loss ${s.loss.toFixed(4)} baseline ${s.baselineLoss.toFixed(4)}` }),
      });
      emit(flags, { event: 'done', name: job.name, kind: 'mlp', ...result }, () =>
        [
          `${job.name}: ${steps} steps of ${job.batchSize} messages in ${(result.elapsedMs / 1000).toFixed(1)} s`,
          `held-out accuracy ${(result.accuracy * 100).toFixed(2)}% (loss ${result.heldoutLoss.toFixed(4)}); logistic-regression baseline ${(result.baselineAccuracy * 100).toFixed(2)}%; always guessing the majority class ${(result.majorityRate * 100).toFixed(2)}%`,
          `it works locally: put it on the network with nbcli job submit`,
        ].join('\n'),
      );
      return;
    }
    let corpus;
    try {
      // packed as nbcli job submit uploads it (src/data/dataset.ts): local and network runs train on the same bytes
      corpus = loadLocalCorpus(job.data, flags.specFile ? dirname(flags.specFile) : '.', job.model.config.contextLength);
    } catch (err) {
      throw err instanceof NimbleError ? err : new NimbleError('invalid', (err as Error).message);
    }
    const result = trainLocal(engine, {
      model: job.model.config,
      corpus,
      steps,
      batchSize: job.batchSize,
      seed: job.seed,
      evalBatches: 20,
      optimizer: { lr: job.learningRate },
      onStep: (s) => flags.json || bar.update({ done: s.step, total: s.steps, elapsedMs: s.elapsedMs, text: `loss ${s.loss.toFixed(4)} ${Math.round(s.tokensPerSecond).toLocaleString('en-US')} tok/s` }),
    });
    const out = flags.out ?? localCheckpointPath(resolveDataDir(flags), job.name);
    saveStage(result.stage, out, steps);
    result.stage.release();
    emit(flags, { event: 'done', name: job.name, kind: 'gpt', steps, finalLoss: result.finalLoss, heldoutLoss: result.heldoutLoss, tokensPerSecond: result.tokensPerSecond, checkpoint: out }, () =>
      [
        `${job.name}: ${steps} steps in ${(result.elapsedMs / 1000).toFixed(1)} s, ${Math.round(result.tokensPerSecond).toLocaleString('en-US')} tokens/s`,
        `training loss ${result.finalLoss.toFixed(4)}, held-out loss ${result.heldoutLoss.toFixed(4)} nats/byte`,
        `checkpoint: ${out}`,
        `it works locally: see what it needs with nbcli job plan, put it on the network with nbcli job submit`,
      ].join('\n'),
    );
  } finally {
    await engine.close();
  }
}

/** Where `job run --local` keeps its checkpoint by default. */
export function localCheckpointPath(dataDir: string, name: string): string {
  return join(dataDir, 'checkpoints', `${name}-local.safetensors`);
}
