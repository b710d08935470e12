// What a host trainer (./stage-trainer-host.ts) trains, whatever the model:
// a range of a GPT's parts on its byte corpus, or a whole MLP classifier on
// the SpamAssassin features (src/data/spam.ts), with its flat parameters and
// gradients in the WASM memory. Each answers the same few calls: forward
// from a shard's batch or a received activation, the loss and backward at
// the last stage, backward from a received gradient. The trainer adds weight
// stashing and prediction and the inner AdamW; the runner (./stage-runner.ts)
// the activation slots, the DiLoCo state and checkpoints
// (src/model/checkpoint.ts by model reference). A GPT stage on a GPU is not
// one of these: its trainer keeps everything on the GPU (./stage-trainer-gpu.ts).
//
// An MLP is one stage (src/model/model-ref.ts): it loads its batch and runs
// forward, loss and backward at once, as the last stage of a one-stage GPT
// run does; it never sends or receives an activation.
import { batchForShard } from '../data/batches.ts';
import type { ByteCorpus } from '../data/corpus.ts';
import { loadNamedCorpus } from '../data/dataset.ts';
import { partCount, type StageRange } from '../model/parts.ts';
import type { ModelRef } from '../model/model-ref.ts';
import type { FlatTensors, ParamLayout } from '../model/params.ts';
import type { StageAssignment } from '../protocol/messages.ts';

export interface StageModel {
  readonly model: ModelRef;
  readonly range: StageRange;
  readonly layout: ParamLayout;
  readonly params: FlatTensors;
  readonly grads: FlatTensors;
  readonly paramCount: number;
  /** microbatches that can be held between forward and backward */
  readonly slotCount: number;
  /** [rows, width] of an activation (or its gradient) entering or leaving the stage */
  readonly activationShape: [number, number];
  /** tokens (GPT) or examples (MLP) one microbatch trains on */
  readonly itemsPerMicrobatch: number;
  /**
   * Forward of a microbatch with `weights` (the stage's layout; the stage's
   * own parameters are not changed), kept in `slot` for its backward: from
   * the batch of `shard` (first stage, `input` null) or from a received
   * activation. Resolves to the output activation (the caller's to keep).
   */
  forward(shard: number, input: Float32Array | null, slot: number, weights: Float32Array): Promise<Float32Array>;
  /** Last stage: forward to the loss on the batch of `shard` with the current parameters, then backward (gradients accumulated). d(input) when the stage is not first. */
  lossAndBackward(shard: number, input: Float32Array | null, slot: number): Promise<{ loss: number; dInput: Float32Array | null }>;
  /** Backward of the microbatch held in `slot` from the gradient of its output, with `weights` (gradients accumulated); d(input), or null at the first stage. */
  backward(dOutput: Float32Array, slot: number, weights: Float32Array): Promise<Float32Array | null>;
  zeroGrad(): void;
  /** Resolves once the stage can run (a GPU stage compiles its kernels in the background), or rejects with why it cannot. */
  ready(): Promise<void>;
  release(): void;
}

/** Runs `fn` with `params` set to `weights`, then puts the current ones back (through `keep`, a buffer of the same size). */
export function withWeights<T>(params: Float32Array, keep: Float32Array, weights: Float32Array, fn: () => T): T {
  if (weights === params) return fn();
  keep.set(params);
  params.set(weights);
  try {
    return fn();
  } finally {
    params.set(keep);
  }
}

/** What every GPT stage has, whatever runs it: its range, shape and byte corpus (an edge stage loads its batches; a middle one needs none). */
export class GptStageData {
  readonly corpus: ByteCorpus | null;
  readonly range: StageRange;
  /** sequences per microbatch, and the context length */
  readonly B: number;
  readonly T: number;

  constructor(
    readonly model: Extract<ModelRef, { kind: 'gpt' }>,
    readonly a: StageAssignment,
    corpus?: ByteCorpus,
  ) {
    const config = model.config;
    // the corpora are bytes: a smaller vocabulary would index past the embedding and the logits
    if (config.vocabSize < 256) throw new Error(`model '${model.ref}' has a vocabulary of ${config.vocabSize}; byte data needs 256`);
    this.range = { from: a.from, to: a.to };
    this.B = a.batchSize;
    this.T = config.contextLength;
    const isEdge = a.from === 0 || a.to === partCount(config);
    // an uploaded dataset comes downloaded by the miner (./datasets.ts); a named corpus is loaded here, a path never
    this.corpus = isEdge ? (corpus ?? loadNamedCorpus(a.data)) : null;
  }

  get activationShape(): [number, number] {
    return [this.B * this.T, this.model.config.channels];
  }

  get itemsPerMicrobatch(): number {
    return this.B * this.T;
  }

  /** The batch of `shard` (an edge stage's: a middle stage has no corpus). */
  batch(shard: number): { inputs: Int32Array; targets: Int32Array } {
    if (!this.corpus) throw new Error('a middle stage has no corpus');
    return batchForShard(this.corpus.train, this.a.seed, shard, this.B, this.T);
  }
}

