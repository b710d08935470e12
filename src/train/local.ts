// Training in one process: the whole model as a single stage, batches drawn
// by shard id from the corpus, AdamW, a held-out evaluation at the end.
import type { ByteCorpus } from '../data/corpus.ts';
import { batchForShard } from '../data/batches.ts';
import type { Engine } from '../engine/engine.ts';
import { AdamW, ADAMW_DEFAULTS, type AdamWConfig } from '../model/adamw.ts';
import { gptConfig, validateGptConfig, type GptConfig } from '../model/config.ts';
import { GptStage } from '../model/gpt.ts';
import { partCount } from '../model/parts.ts';

export interface LocalTrainOptions {
  /** a named config (src/model/config.ts), or the config itself */
  model: string | GptConfig;
  corpus: ByteCorpus;
  steps: number;
  batchSize?: number;
  seed?: number;
  optimizer?: Partial<AdamWConfig>;
  /** held-out batches averaged at the end */
  evalBatches?: number;
  onStep?: (info: StepInfo) => void;
}

export interface StepInfo {
  step: number;
  steps: number;
  loss: number;
  gradNorm: number;
  /** tokens per second over the last step */
  tokensPerSecond: number;
  elapsedMs: number;
}

export interface LocalTrainResult {
  stage: GptStage;
  steps: number;
  finalLoss: number;
  heldoutLoss: number;
  /** median tokens/s over the steps after the first */
  tokensPerSecond: number;
  elapsedMs: number;
}

/** Mean loss over `batches` held-out batches (forward only). */
export function heldoutLoss(stage: GptStage, corpus: ByteCorpus, batches: number, batchSize: number, seed = 424242): number {
  const T = stage.config.contextLength;
  let sum = 0;
  for (let i = 0; i < batches; i++) {
    const batch = batchForShard(corpus.heldout, seed, i, batchSize, T);
    sum += stage.forward(batch.inputs, batchSize, T, batch.targets) as number;
  }
  return sum / batches;
}

export function trainLocal(engine: Engine, options: LocalTrainOptions): LocalTrainResult {
  const config = typeof options.model === 'string' ? gptConfig(options.model) : options.model;
  validateGptConfig(config);
  const B = options.batchSize ?? 12;
  const T = config.contextLength;
  const seed = options.seed ?? 1337;
  const stage = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: B, seed });
  const opt = new AdamW(engine, stage.params, stage.grads, { ...ADAMW_DEFAULTS, ...options.optimizer });
  const rates: number[] = [];
  const start = performance.now();
  let loss = NaN;
  for (let step = 0; step < options.steps; step++) {
    const t0 = performance.now();
    const batch = batchForShard(options.corpus.train, seed, step, B, T);
    stage.zeroGrad();
    loss = stage.forward(batch.inputs, B, T, batch.targets) as number;
    stage.backward();
    const gradNorm = opt.update();
    const dt = performance.now() - t0;
    const tokensPerSecond = (B * T * 1000) / dt;
    if (step > 0) rates.push(tokensPerSecond);
    if (!Number.isFinite(loss)) throw new Error(`training diverged at step ${step + 1}: loss ${loss}`);
    options.onStep?.({ step: step + 1, steps: options.steps, loss, gradNorm, tokensPerSecond, elapsedMs: performance.now() - start });
  }
  const elapsedMs = performance.now() - start;
  const heldout = heldoutLoss(stage, options.corpus, options.evalBatches ?? 200, B);
  rates.sort((a, b) => a - b);
  const tokensPerSecond = rates.length ? rates[rates.length >> 1] : NaN;
  opt.release();
  return { stage, steps: options.steps, finalLoss: loss, heldoutLoss: heldout, tokensPerSecond, elapsedMs };
}
