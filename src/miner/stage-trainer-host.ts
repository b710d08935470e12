// The inner loop of a stage model whose weights live in host memory
// (./stage-model.ts: a GPT range or the MLP on WASM, or the MLP with its
// kernels on the GPU): AdamW on the WASM engine, and one copy of the weights
// per activation slot (weight stashing), filled with the predicted weights
// at the slot's forward. Spot-check records copy the weights into a small
// pool of host arrays, so steady training allocates nothing.
import type { ByteCorpus } from '../data/corpus.ts';
import type { Engine } from '../engine/engine.ts';
import { AdamW, ADAMW_DEFAULTS } from '../model/adamw.ts';
import type { StageRange } from '../model/parts.ts';
import type { ModelRef } from '../model/model-ref.ts';
import type { ParamLayout } from '../model/params.ts';
import { DEFAULT_MAX_RECORDS, hostWeights, type KeptWeights } from './forward-records.ts';
import { GptStageData, type StageModel } from './stage-model.ts';
import type { StageTrainer } from './stage-trainer.ts';

/** Spare weight copies a host trainer keeps for the next records. */
const SPARE_COPIES = 4;

export class HostStageTrainer implements StageTrainer {
  readonly keptWeightsLimit = DEFAULT_MAX_RECORDS;
  private readonly opt: AdamW;
  /** per slot: the weights its forward used (allocated on first use) */
  private readonly stash: (Float32Array | null)[];
  private readonly spare: Float32Array[] = [];

  constructor(
    engine: Engine,
    /** the stage model it trains (its own: released with the trainer) */
    readonly stage: StageModel,
    lr: number,
  ) {
    this.opt = new AdamW(engine, stage.params, stage.grads, { ...ADAMW_DEFAULTS, lr });
    this.stash = new Array<Float32Array | null>(stage.slotCount).fill(null);
  }

  get model(): ModelRef {
    return this.stage.model;
  }

  get range(): StageRange {
    return this.stage.range;
  }

  get layout(): ParamLayout {
    return this.stage.layout;
  }

  get paramCount(): number {
    return this.stage.paramCount;
  }

  get slotCount(): number {
    return this.stage.slotCount;
  }

  get activationShape(): [number, number] {
    return this.stage.activationShape;
  }

  get itemsPerMicrobatch(): number {
    return this.stage.itemsPerMicrobatch;
  }

  get corpus(): ByteCorpus | null {
    return this.stage instanceof GptStageData ? this.stage.corpus : null;
  }

  private get weights(): Float32Array {
    return this.stage.params.flat.data;
  }

  initialWeights(): Float32Array {
    return this.weights.slice();
  }

  forward(shard: number, input: Float32Array | null, slot: number, delay: number): Promise<Float32Array> {
    const stashed = this.opt.predict((this.stash[slot] ??= new Float32Array(this.paramCount)), delay);
    return this.stage.forward(shard, input, slot, stashed);
  }

  async lossAndBackward(shard: number, input: Float32Array | null, slot: number, step: boolean): Promise<{ loss: number; dInput: Float32Array | null }> {
    this.stage.zeroGrad();
    const result = await this.stage.lossAndBackward(shard, input, slot);
    if (step) this.step();
    return result;
  }

  async backward(dOutput: Float32Array, slot: number, step: boolean): Promise<Float32Array | null> {
    const stashed = this.stash[slot];
    if (!stashed) throw new Error(`slot ${slot} holds no forward`);
    this.stage.zeroGrad();
    const d = await this.stage.backward(dOutput, slot, stashed);
    if (step) this.step();
    return d;
  }

  keepSlotWeights(slot: number): KeptWeights {
    const stashed = this.stash[slot];
    if (!stashed) throw new Error(`slot ${slot} holds no forward`);
    return this.keep(stashed);
  }

  keepWeights(): KeptWeights {
    return this.keep(this.weights);
  }

  readWeights(): Promise<Float32Array> {
    return Promise.resolve(this.weights.slice());
  }

  writeWeights(weights: Float32Array): void {
    if (weights.length !== this.paramCount) throw new RangeError(`${weights.length} weights for a stage of ${this.paramCount}`);
    this.weights.set(weights);
  }

  zeroWeights(): void {
    this.weights.fill(0);
  }

  ready(): Promise<void> {
    return this.stage.ready();
  }

  release(): void {
    this.opt.release();
    this.stage.release();
  }

  private step(): void {
    const norm = this.opt.update();
    if (!Number.isFinite(norm)) throw new Error('gradient norm is not finite');
  }

  /** A copy of `weights` in a pooled array, handed back to the pool when released. */
  private keep(weights: Float32Array): KeptWeights {
    const copy = this.spare.pop() ?? new Float32Array(this.paramCount);
    copy.set(weights);
    return hostWeights(copy, (w) => {
      if (this.spare.length < SPARE_COPIES) this.spare.push(w);
    });
  }
}
