// The stage models that run on the WASM engine (./stage-model.ts says what a
// stage model is): a range of a GPT's parts (src/model/gpt.ts GptStage), and
// the whole MLP classifier on the SpamAssassin features (src/data/spam.ts).
import type { ByteCorpus } from '../data/corpus.ts';
import { loadSpamDataset, spamBatch, SPAM_CLASSES, type SpamDataset } from '../data/spam.ts';
import type { Engine } from '../engine/engine.ts';
import { GptStage } from '../model/gpt.ts';
import { type StageRange } from '../model/parts.ts';
import { Mlp } from '../model/mlp.ts';
import type { ModelRef } from '../model/model-ref.ts';
import type { FlatTensors, ParamLayout } from '../model/params.ts';
import type { StageAssignment } from '../protocol/messages.ts';
import { GptStageData, withWeights, type StageModel } from './stage-model.ts';

/** A range of a GPT's parts on the WASM engine. */
export class GptStageModel extends GptStageData implements StageModel {
  readonly gpt: GptStage;
  /** the current weights while a forward or backward runs with others */
  private readonly keep: Float32Array;

  constructor(engine: Engine, model: Extract<ModelRef, { kind: 'gpt' }>, a: StageAssignment, slots: number, corpus?: ByteCorpus) {
    super(model, a, corpus);
    this.gpt = new GptStage(engine, model.config, this.range, { batchSize: a.batchSize, seed: a.seed, slots });
    this.keep = new Float32Array(this.gpt.paramCount);
  }

  get layout(): ParamLayout {
    return this.gpt.layout;
  }

  get params(): FlatTensors {
    return this.gpt.params;
  }

  get grads(): FlatTensors {
    return this.gpt.grads;
  }

  get paramCount(): number {
    return this.gpt.paramCount;
  }

  get slotCount(): number {
    return this.gpt.slotCount;
  }

  async forward(shard: number, input: Float32Array | null, slot: number, weights: Float32Array): Promise<Float32Array> {
    const tokens = input ? null : this.batch(shard).inputs;
    return withWeights(this.gpt.params.flat.data, this.keep, weights, () => (this.gpt.forward(input ?? tokens!, this.B, this.T, undefined, slot) as Float32Array).slice());
  }

  async lossAndBackward(shard: number, input: Float32Array | null, slot: number): Promise<{ loss: number; dInput: Float32Array | null }> {
    const batch = this.batch(shard);
    const loss = this.gpt.forward(input ?? batch.inputs, this.B, this.T, batch.targets, slot) as number;
    return { loss, dInput: this.gpt.backward(undefined, slot)?.slice() ?? null };
  }

  async backward(dOutput: Float32Array, slot: number, weights: Float32Array): Promise<Float32Array | null> {
    return withWeights(this.gpt.params.flat.data, this.keep, weights, () => this.gpt.backward(dOutput, slot)?.slice() ?? null);
  }

  ready(): Promise<void> {
    return Promise.resolve();
  }

  zeroGrad(): void {
    this.gpt.zeroGrad();
  }

  release(): void {
    this.gpt.release();
  }
}

/** The data of an MLP assignment, the SpamAssassin features, after checking the assignment is one an MLP trains (whichever backend runs it). */
export function mlpDataset(model: Extract<ModelRef, { kind: 'mlp' }>, a: StageAssignment): SpamDataset {
  if (a.stage !== 0 || a.stageCount !== 1 || a.from !== 0 || a.to !== 1) throw new Error(`an MLP is one stage [0, 1); assigned stage ${a.stage} of ${a.stageCount} [${a.from}, ${a.to})`);
  if (a.data !== 'spam-assassin') throw new Error(`an MLP classifier trains on 'spam-assassin', not '${a.data.slice(0, 80)}'`);
  if (model.config.classes !== SPAM_CLASSES.length) throw new Error(`spam-assassin has ${SPAM_CLASSES.length} classes; model '${model.ref}' has ${model.config.classes}`);
  return loadSpamDataset(model.config.inputs);
}

/** The whole MLP classifier on the SpamAssassin features (as many hash buckets as it has inputs). */
export class MlpStageModel implements StageModel {
  readonly mlp: Mlp;
  readonly dataset: SpamDataset;
  readonly range: StageRange = { from: 0, to: 1 };

  constructor(
    engine: Engine,
    readonly model: Extract<ModelRef, { kind: 'mlp' }>,
    protected readonly a: StageAssignment,
    /** microbatches queued for this stage; each runs forward, loss and backward at once */
    readonly slotCount: number,
  ) {
    this.dataset = mlpDataset(model, a);
    this.mlp = new Mlp(engine, model.config, a.batchSize, a.seed);
  }

  get layout(): ParamLayout {
    return this.mlp.layout;
  }

  get params(): FlatTensors {
    return this.mlp.params;
  }

  get grads(): FlatTensors {
    return this.mlp.grads;
  }

  get paramCount(): number {
    return this.mlp.layout.size;
  }

  get activationShape(): [number, number] {
    return [this.a.batchSize, this.model.config.inputs];
  }

  get itemsPerMicrobatch(): number {
    return this.a.batchSize;
  }

  forward(): Promise<Float32Array> {
    return Promise.reject(new Error('an MLP is one stage: it sends no activation on'));
  }

  async lossAndBackward(shard: number, input: Float32Array | null): Promise<{ loss: number; dInput: Float32Array | null }> {
    if (input) throw new Error('an MLP is one stage: it receives no activation');
    const batch = spamBatch(this.dataset, this.a.seed, shard, this.a.batchSize);
    const loss = this.mlp.forward(batch.x, batch.B, batch.y) as number;
    this.mlp.backward();
    return { loss, dInput: null };
  }

  backward(): Promise<Float32Array | null> {
    return Promise.reject(new Error('an MLP is one stage: it receives no gradient'));
  }

  ready(): Promise<void> {
    return Promise.resolve();
  }

  zeroGrad(): void {
    this.mlp.zeroGrad();
  }

  release(): void {
    this.mlp.release();
  }
}
