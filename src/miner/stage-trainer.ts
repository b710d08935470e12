// What a miner's stage runner (./stage-runner.ts) trains with: a stage model
// and its inner loop, wherever they run. Forwards run with the weights AdamW
// is predicted to reach by the time their gradient is applied, and keep them
// in the microbatch's slot; backwards run with the weights their forward
// used; each backward is followed by the inner AdamW step (see the runner
// for why). Two homes:
// - ./stage-trainer-host.ts: a stage model (./stage-model.ts) computing with
//   weights in host memory, on WASM or with its kernels on the GPU, and
//   AdamW on the WASM engine;
// - ./stage-trainer-gpu.ts: a GPT stage whose weights, gradients, AdamW
//   moments and slot weights all stay on the GPU; only what leaves the miner
//   (activations, gradients sent on, the loss, merges' pseudo-gradients,
//   stage states and spot-check bundles) is read back.
import type { ByteCorpus } from '../data/corpus.ts';
import type { StageRange } from '../model/parts.ts';
import type { ModelRef } from '../model/model-ref.ts';
import type { ParamLayout } from '../model/params.ts';
import type { KeptWeights } from './forward-records.ts';

export interface StageTrainer {
  readonly model: ModelRef;
  readonly range: StageRange;
  readonly layout: ParamLayout;
  readonly paramCount: number;
  /** microbatches that can be held between forward and backward */
  readonly slotCount: number;
  /** [rows, width] of an activation (or its gradient) entering or leaving the stage */
  readonly activationShape: [number, number];
  /** tokens (GPT) or examples (MLP) one microbatch trains on */
  readonly itemsPerMicrobatch: number;
  /** the byte corpus of a GPT's first or last stage (null: a middle stage, or an MLP) */
  readonly corpus: ByteCorpus | null;
  /** copies of the weights (spot-check records) it can keep at once */
  readonly keptWeightsLimit: number;
  /** The weights as the stage was created (before any step), a copy in host memory. */
  initialWeights(): Float32Array;
  /**
   * Forward of a microbatch with the weights predicted `delay` inner steps
   * ahead, kept in `slot` with its activations for the backward: from the
   * batch of `shard` (first stage, `input` null) or from a received
   * activation. Resolves to the output activation (the caller's to keep).
   */
  forward(shard: number, input: Float32Array | null, slot: number, delay: number): Promise<Float32Array>;
  /** Last stage: forward to the loss on the batch of `shard` with the current weights, backward, then the inner step when `step`. d(input) when the stage is not first. */
  lossAndBackward(shard: number, input: Float32Array | null, slot: number, step: boolean): Promise<{ loss: number; dInput: Float32Array | null }>;
  /** Backward of the microbatch held in `slot` from the gradient of its output, with the weights its forward used, then the inner step when `step`; d(input), or null at the first stage. */
  backward(dOutput: Float32Array, slot: number, step: boolean): Promise<Float32Array | null>;
  /** A copy of the weights the forward held in `slot` used. */
  keepSlotWeights(slot: number): KeptWeights;
  /** A copy of the current weights (what the next lossAndBackward runs with). */
  keepWeights(): KeptWeights;
  /** The current weights, after every step queued so far: a copy in host memory. */
  readWeights(): Promise<Float32Array>;
  /** Replaces the current weights (the AdamW moments stay). */
  writeWeights(weights: Float32Array): void;
  /** Fault injection (./tamper.ts): the weights set to zero. */
  zeroWeights(): void;
  /** Resolves once the stage can run (a GPU stage compiles its kernels in the background), or rejects with why it cannot. */
  ready(): Promise<void>;
  release(): void;
}
