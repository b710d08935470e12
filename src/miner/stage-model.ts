// What a miner's stage runner (./stage-runner.ts) trains, whatever the model:
// a range of a GPT's parts on its byte corpus, or a whole MLP classifier on
// the SpamAssassin features (src/data/spam.ts). Each answers the same few
// calls: forward from a shard's batch or a received activation, the loss and
// backward at the last stage, backward from a received gradient, and its
// flat parameters and gradients. The runner does the rest the same way for
// both: activation slots, weight stashing and prediction, the inner AdamW,
// the DiLoCo state, checkpoints (src/model/checkpoint.ts by model reference).
//
// An MLP is one stage (src/model/model-ref.ts): it loads its batch and runs
// forward, loss and backward at once, as the last stage of a one-stage GPT
// run does; it never sends or receives an activation.
import { batchForShard } from '../data/batches.ts';
import type { ByteCorpus } from '../data/corpus.ts';
import { loadNamedCorpus } from '../data/dataset.ts';
import { loadSpamDataset, loadSpamDatasetAsync, spamBatch, SPAM_CLASSES, SPAM_MAX_FEATURES, spamDatasetIfBuilt, type SpamDataset } from '../data/spam.ts';
import type { Engine } from '../engine/engine.ts';
import { GptStage, partCount, type StageRange } from '../model/gpt.ts';
import { Mlp } from '../model/mlp.ts';
import { parseModelRef, type ModelRef } from '../model/model-ref.ts';
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
   * Forward of a microbatch, kept in `slot` for its backward: from the batch
   * of `shard` (first stage, `input` null) or from a received activation.
   * Returns the output activation (a view, valid until the next call).
   */
  forward(shard: number, input: Float32Array | null, slot: number): Float32Array;
  /** Last stage: forward to the loss on the batch of `shard`, then backward (gradients accumulated). d(input) when the stage is not first. */
  lossAndBackward(shard: number, input: Float32Array | null, slot: number): { loss: number; dInput: Float32Array | null };
  /** Backward of the microbatch held in `slot` from the gradient of its output; d(input), or null at the first stage. */
  backward(dOutput: Float32Array, slot: number): Float32Array | null;
  zeroGrad(): void;
  release(): void;
}

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
 * The model of an assignment (its reference parsed and validated, its data
 * loaded): `corpus` is an edge GPT stage's corpus when the miner has it
 * already (an uploaded dataset); a named one is loaded here.
 */
export function createStageModel(engine: Engine, a: StageAssignment, slots: number, corpus?: ByteCorpus): StageModel {
  const model = parseModelRef(a.model);
  return model.kind === 'mlp' ? new MlpStageModel(engine, model, a, slots) : new GptStageModel(engine, model, a, slots, corpus);
}

/** A range of a GPT's parts on a byte corpus (an edge stage loads its batches; a middle one needs none). */
export class GptStageModel implements StageModel {
  readonly gpt: GptStage;
  readonly corpus: ByteCorpus | null;
  readonly range: StageRange;
  private readonly B: number;
  private readonly T: number;

  constructor(
    engine: Engine,
    readonly model: Extract<ModelRef, { kind: 'gpt' }>,
    private readonly a: StageAssignment,
    slots: number,
    corpus?: ByteCorpus,
  ) {
    const config = model.config;
    // the corpora are bytes: a smaller vocabulary would index past the embedding and the logits
    if (config.vocabSize < 256) throw new Error(`model '${model.ref}' has a vocabulary of ${config.vocabSize}; byte data needs 256`);
    this.range = { from: a.from, to: a.to };
    this.B = a.batchSize;
    this.T = config.contextLength;
    const isEdge = a.from === 0 || a.to === partCount(config);
    this.gpt = new GptStage(engine, config, this.range, { batchSize: a.batchSize, seed: a.seed, slots });
    try {
      // an uploaded dataset comes downloaded by the miner (./datasets.ts); a named corpus is loaded here, a path never
      this.corpus = isEdge ? (corpus ?? loadNamedCorpus(a.data)) : null;
    } catch (err) {
      this.gpt.release();
      throw err;
    }
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

  get activationShape(): [number, number] {
    return [this.B * this.T, this.model.config.channels];
  }

  get itemsPerMicrobatch(): number {
    return this.B * this.T;
  }

  private batch(shard: number): { inputs: Int32Array; targets: Int32Array } {
    if (!this.corpus) throw new Error('a middle stage has no corpus');
    return batchForShard(this.corpus.train, this.a.seed, shard, this.B, this.T);
  }

  forward(shard: number, input: Float32Array | null, slot: number): Float32Array {
    return this.gpt.forward(input ?? this.batch(shard).inputs, this.B, this.T, undefined, slot) as Float32Array;
  }

  lossAndBackward(shard: number, input: Float32Array | null, slot: number): { loss: number; dInput: Float32Array | null } {
    const batch = this.batch(shard);
    const loss = this.gpt.forward(input ?? batch.inputs, this.B, this.T, batch.targets, slot) as number;
    return { loss, dInput: this.gpt.backward(undefined, slot) };
  }

  backward(dOutput: Float32Array, slot: number): Float32Array | null {
    return this.gpt.backward(dOutput, slot);
  }

  zeroGrad(): void {
    this.gpt.zeroGrad();
  }

  release(): void {
    this.gpt.release();
  }
}

/** The whole MLP classifier on the SpamAssassin features (as many hash buckets as it has inputs). */
export class MlpStageModel implements StageModel {
  readonly mlp: Mlp;
  readonly dataset: SpamDataset;
  readonly range: StageRange = { from: 0, to: 1 };

  constructor(
    engine: Engine,
    readonly model: Extract<ModelRef, { kind: 'mlp' }>,
    private readonly a: StageAssignment,
    /** microbatches queued for this stage; each runs forward, loss and backward at once */
    readonly slotCount: number,
  ) {
    if (a.stage !== 0 || a.stageCount !== 1 || a.from !== 0 || a.to !== 1) throw new Error(`an MLP is one stage [0, 1); assigned stage ${a.stage} of ${a.stageCount} [${a.from}, ${a.to})`);
    if (a.data !== 'spam-assassin') throw new Error(`an MLP classifier trains on 'spam-assassin', not '${a.data.slice(0, 80)}'`);
    if (model.config.classes !== SPAM_CLASSES.length) throw new Error(`spam-assassin has ${SPAM_CLASSES.length} classes; model '${model.ref}' has ${model.config.classes}`);
    this.dataset = loadSpamDataset(model.config.inputs);
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

  forward(): Float32Array {
    throw new Error('an MLP is one stage: it sends no activation on');
  }

  lossAndBackward(shard: number, input: Float32Array | null): { loss: number; dInput: Float32Array | null } {
    if (input) throw new Error('an MLP is one stage: it receives no activation');
    const batch = spamBatch(this.dataset, this.a.seed, shard, this.a.batchSize);
    const loss = this.mlp.forward(batch.x, batch.B, batch.y) as number;
    this.mlp.backward();
    return { loss, dInput: null };
  }

  backward(): Float32Array | null {
    throw new Error('an MLP is one stage: it receives no gradient');
  }

  zeroGrad(): void {
    this.mlp.zeroGrad();
  }

  release(): void {
    this.mlp.release();
  }
}
