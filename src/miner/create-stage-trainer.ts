// Which stage trainer an assignment gets (./stage-trainer.ts says what one
// is), and whether the data it loads itself is at hand.
import type { ByteCorpus } from '../data/corpus.ts';
import { loadSpamDatasetAsync, SPAM_MAX_FEATURES, spamDatasetIfBuilt } from '../data/spam.ts';
import type { Engine } from '../engine/engine.ts';
import { parseModelRef, type ModelRef } from '../model/model-ref.ts';
import type { StageAssignment } from '../protocol/messages.ts';
import type { StageModel } from './stage-model.ts';
import type { StageTrainer } from './stage-trainer.ts';
import { GpuGptStageTrainer } from './stage-trainer-gpu.ts';
import { GpuMlpStageTrainer } from './stage-trainer-gpu-mlp.ts';
import { HostStageTrainer } from './stage-trainer-host.ts';
import { GptStageModel, MlpStageModel } from './stage-model-wasm.ts';

/**
 * Whether the data an assignment's stage loads itself is at hand: the
 * SpamAssassin features of an MLP are built in the background on the first
 * call (about 1.4 s of work for 4,096 buckets, in slices: the miner's
 * heartbeats go on meanwhile), and false is returned until they are. True
 * for a GPT (its corpus is loaded or downloaded elsewhere) and for a
 * reference that does not parse (createStageModel refuses it by name).
 */
export function stageDataReady(a: StageAssignment, log: (line: string) => void = () => {}): boolean {
  let model: ModelRef;
  try {
    model = parseModelRef(a.model);
  } catch {
    return true;
  }
  if (model.kind !== 'mlp' || a.data !== 'spam-assassin' || !(model.config.inputs <= SPAM_MAX_FEATURES)) return true;
  if (spamDatasetIfBuilt(model.config.inputs)) return true;
  loadSpamDatasetAsync(model.config.inputs).then(
    () => log(`built the spam-assassin features (${model.config.inputs} buckets)`),
    (err: unknown) => log(`building the spam-assassin features failed: ${(err as Error).message}`),
  );
  return false;
}

/**
 * The trainer of an assignment (its model reference parsed and validated,
 * its data loaded): `corpus` is an edge GPT stage's corpus when the miner
 * has it already (an uploaded dataset); a named one is loaded here. A GPT
 * or an MLP trains on the engine's GPU when it has one, weights and AdamW
 * included (./stage-trainer-gpu.ts, ./stage-trainer-gpu-mlp.ts), else on
 * WASM (./stage-trainer-host.ts); a decoder with an arch (Llama, Qwen2,
 * imported GPT-2) on WASM always, until the WebGPU backend has its kernels.
 */
export function createStageTrainer(engine: Engine, a: StageAssignment, slots: number, corpus?: ByteCorpus): StageTrainer {
  const model = parseModelRef(a.model);
  // a Llama / Qwen2 / GPT-2 block (an arch) has no WGSL twins yet: it trains on WASM whatever the engine has
  const gpuRuns = model.kind === 'mlp' || !model.config.arch;
  if (engine.gpu && gpuRuns) return model.kind === 'gpt' ? new GpuGptStageTrainer(engine.gpu, model, a, slots, corpus) : new GpuMlpStageTrainer(engine.gpu, model, a, slots);
  const stage: StageModel = model.kind === 'mlp' ? new MlpStageModel(engine, model, a, slots) : new GptStageModel(engine, model, a, slots, corpus);
  try {
    return new HostStageTrainer(engine, stage, a.lr);
  } catch (err) {
    stage.release();
    throw err;
  }
}

