// A training stage of a decoder (any architecture of ./arch.ts): the parts
// [from, to) of ./parts.ts (embedding, blocks, final norm + head). Each stage
// owns its parameters, gradients and activations as flat buffers in the
// engine memory, runs forward from token ids (first stage) or an activation,
// and backward from the loss (last stage) or an upstream activation gradient.
// The head is untied from the token embedding, so the first and last stage
// share no weights and can live on different machines. The blocks are
// ./block.ts's.
//
// With a LoRA spec (options.lora, ./lora.ts) the stage holds its parts'
// weights frozen in `base` and trains only the adapters of its blocks:
// `params` and `grads` (what the optimizer, merges and checkpoints see) are
// the adapters alone, so AdamW state exists only for what trains. The
// activations' gradients flow through the frozen weights as before.
import type { Engine } from '../engine/engine.ts';
import type { Tensor } from '../engine/tensor.ts';
import { blockActs, blockBackward, blockForward, blockScratch, blockShape, headNormBackward, headNormForward, type BlockActs, type BlockRope, type BlockScratch, type BlockShape, type BlockTensors } from './block.ts';
import { type GptConfig, validateGptConfig } from './config.ts';
import { sequencePositions } from './decoder-layers.ts';
import { initParams } from './init.ts';
import * as L from './layers.ts';
import { frozenLinearBackward, type BlockLora } from './lora-linear.ts';
import { blockLora, createLoraParams, loraScratch } from './lora-stage.ts';
import { validateLoraSpec, type LoraSpec } from './lora.ts';
import { FlatTensors, ParamLayout, type ParamSpec } from './params.ts';
import { partCount, partParams, rangeParts, type StageRange } from './parts.ts';
import { createRopeTable, type RopeTable } from './rope.ts';

/** Everything one microbatch in flight keeps between forward and backward. */
interface SlotActs {
  tokens: L.IntBuffer;
  targets: L.IntBuffer;
  inputAct: Tensor;
  blocks: BlockActs[];
  /** each block's adapters (LoRA), else empty */
  lora: BlockLora[];
  lnf?: Tensor;
  lnfMean?: Tensor;
  lnfRstd?: Tensor;
  logits?: Tensor;
  probs?: Tensor;
  losses?: Tensor;
  /** shape of the slot's last forward pass */
  B: number;
  T: number;
}

/**
 * A stage's flat parameters (initialised from `seed`: the same seed gives the
 * same weights, whole or split) and gradients (zero), laid out by its parts.
 */
export function createStageParams(engine: Engine, config: GptConfig, range: StageRange, seed: number): { layout: ParamLayout; params: FlatTensors; grads: FlatTensors } {
  const params = createStageWeights(engine, config, range, seed);
  return { layout: params.layout, params, grads: new FlatTensors(params.layout, engine) };
}

/** A stage's flat weights alone, initialised from `seed` (a LoRA stage's frozen base, until real weights are copied in). */
export function createStageWeights(engine: Engine, config: GptConfig, range: StageRange, seed: number): FlatTensors {
  const specs: ParamSpec[] = [];
  for (let p = range.from; p < range.to; p++) specs.push(...partParams(config, p));
  const params = new FlatTensors(new ParamLayout(specs), engine);
  initParams(params.layout, params.flat.data, seed);
  return params;
}

export interface StageOptions {
  /** largest batch this stage runs */
  batchSize: number;
  /** initialisation seed (same seed = same weights, whole or split) */
  seed?: number;
  /**
   * Microbatches that can be in flight at once (forward done, backward not
   * yet): each slot keeps its own activations. Default 1.
   */
  slots?: number;
  /** train LoRA adapters of these targets over frozen base weights (the stage's `base`) instead of every weight */
  lora?: LoraSpec;
}

export class GptStage {
  /** what trains: every weight, or with LoRA the adapters alone */
  readonly layout: ParamLayout;
  readonly params: FlatTensors;
  readonly grads: FlatTensors;
  /** LoRA: the spec (targets in layout order), and the parts' frozen weights (laid out as a full stage's params); null when every weight trains */
  readonly lora: LoraSpec | null = null;
  readonly base: FlatTensors | null = null;
  readonly isFirst: boolean;
  readonly isLast: boolean;
  readonly maxBatch: number;
  private readonly engine: Engine;
  private readonly tensors: Tensor[] = [];
  private readonly ints: L.IntBuffer[] = [];
  private readonly slots: SlotActs[] = [];
  private readonly blockIds: number[] = [];
  private readonly shape: BlockShape;
  /** rotary embeddings' table and the rows' positions (null with learned positions) */
  private readonly rope: BlockRope | null = null;
  // backward scratch, shared by the slots
  private readonly scratch: BlockScratch;
  private readonly dlogits?: Tensor;
  /** the weights the forward runs on: params, or LoRA's frozen base */
  private readonly weights: FlatTensors;
  private readonly seed: number;
  /** forwards run so far: the default seed of each one's dropout masks */
  private forwards = 0;
  private dropoutOn = true;
  private released = false;

  constructor(
    engine: Engine,
    readonly config: GptConfig,
    readonly range: StageRange,
    options: StageOptions,
  ) {
    validateGptConfig(config);
    const parts = partCount(config);
    if (!(Number.isInteger(range.from) && Number.isInteger(range.to) && 0 <= range.from && range.from < range.to && range.to <= parts)) {
      throw new RangeError(`bad stage range [${range.from}, ${range.to}) for ${parts} parts`);
    }
    this.engine = engine;
    this.isFirst = range.from === 0;
    this.isLast = range.to === parts;
    this.maxBatch = options.batchSize;
    this.seed = options.seed ?? 1337;
    if (options.lora) {
      this.lora = validateLoraSpec(options.lora, config);
      this.base = createStageWeights(engine, config, range, this.seed);
      ({ layout: this.layout, params: this.params, grads: this.grads } = createLoraParams(engine, config, this.lora, range, this.seed));
    } else {
      ({ layout: this.layout, params: this.params, grads: this.grads } = createStageParams(engine, config, range, this.seed));
    }
    this.weights = this.base ?? this.params;

    const { contextLength: T, channels: C, vocabSize: V } = config;
    const B = options.batchSize;
    const N = B * T;
    const t = (shape: number[]): Tensor => {
      const x = engine.tensor(shape);
      this.tensors.push(x);
      return x;
    };
    this.shape = blockShape(config);
    this.blockIds.push(...rangeParts(config, range).blocks);
    if (this.shape.arch.position === 'rope' && this.blockIds.length > 0) {
      const positions = engine.int32(N);
      this.ints.push(positions);
      const table: RopeTable = createRopeTable(engine, this.shape.arch, T);
      this.tensors.push(table.tensor);
      this.rope = { table, positions: { buffer: positions, offset: 0, stride: 1 } };
    }
    const loraShared = this.lora && this.blockIds.length > 0 ? loraScratch(config, this.lora, t, N) : null;
    const slotCount = options.slots ?? 1;
    if (!Number.isInteger(slotCount) || slotCount < 1) throw new RangeError(`slots must be a positive integer, got ${slotCount}`);
    for (let i = 0; i < slotCount; i++) {
      const tokens = engine.int32(N);
      const targets = engine.int32(N);
      this.ints.push(tokens, targets);
      const slot: SlotActs = { tokens, targets, inputAct: t([N, C]), blocks: [], lora: [], B: 0, T: 0 };
      let prev = slot.inputAct;
      for (let b = 0; b < this.blockIds.length; b++) {
        const a = blockActs(this.shape, t, prev, B, T);
        slot.blocks.push(a);
        if (this.lora && loraShared) slot.lora.push(blockLora(config, this.lora, this.blockIds[b], this.params, this.grads, loraShared, t, N));
        prev = a.out;
      }
      if (this.isLast) {
        slot.lnf = t([N, C]);
        slot.lnfMean = t([N]);
        slot.lnfRstd = t([N]);
        slot.logits = t([N, V]);
        slot.probs = t([N, V]);
        slot.losses = t([N]);
      }
      this.slots.push(slot);
    }
    if (this.isLast) this.dlogits = t([N, V]);
    this.scratch = blockScratch(this.shape, t, N);
  }

  /** Parameters in this stage. */
  get paramCount(): number {
    return this.layout.size;
  }

  /** LoRA dropout applies (training, the default) or not (held-out figures, recomputations of an evaluation). */
  get training(): boolean {
    return this.dropoutOn;
  }

  set training(on: boolean) {
    this.dropoutOn = on;
    for (const s of this.slots) for (const l of s.lora) l.training = on;
  }

  /** Microbatches this stage can hold between forward and backward. */
  get slotCount(): number {
    return this.slots.length;
  }

  /** The residual stream entering the head (or leaving the last block). */
  private streamOut(slot: SlotActs): Tensor {
    return slot.blocks.length ? slot.blocks[slot.blocks.length - 1].out : slot.inputAct;
  }

  private slot(index: number): SlotActs {
    const s = this.slots[index];
    if (!s) throw new RangeError(`slot ${index} outside the stage's ${this.slots.length} slots`);
    return s;
  }

  /**
   * Forward pass on a batch of B sequences of T tokens (T ≤ context).
   * input: token ids (first stage) or the activation [B·T·C] from the stage before.
   * targets: next-token ids, needed by the last stage to compute the loss.
   * Returns the output activation [B·T·C] (a view, valid until the next call),
   * or for the last stage the mean loss (with targets) or the logits [B·T·V] (without).
   * `slot` picks which activation set keeps this microbatch until its backward.
   * `dropoutSeed` draws LoRA's dropout masks (the same seed, the same masks:
   * a recomputation passes the seed of the forward it checks); by default
   * each forward draws from (the stage's seed, how many forwards it ran).
   */
  forward(input: Int32Array | Float32Array, B: number, T: number, targets?: Int32Array, slotIndex = 0, dropoutSeed?: number): Float32Array | number {
    this.checkAlive();
    const slot = this.slot(slotIndex);
    const { channels: C, vocabSize: V } = this.config;
    if (!Number.isInteger(B) || !Number.isInteger(T) || B < 1 || T < 1 || B > this.maxBatch || T > this.config.contextLength) {
      throw new RangeError(`batch ${B}×${T} exceeds this stage's ${this.maxBatch}×${this.config.contextLength}`);
    }
    const N = B * T;
    slot.B = B;
    slot.T = T;
    const k = this.engine.kernels;
    const P = this.weights;
    const maskSeed = dropoutSeed ?? (Math.imul(this.seed, 0x9e3779b1) + this.forwards) >>> 0;
    this.forwards++;
    for (const l of slot.lora) l.maskSeed = maskSeed;
    if (this.isFirst) {
      if (!(input instanceof Int32Array) || input.length !== N) throw new TypeError(`first stage takes ${N} token ids`);
      for (let i = 0; i < N; i++) {
        const tok = input[i];
        if (!(tok >= 0 && tok < V)) throw new RangeError(`token ${tok} at ${i} outside the vocabulary of ${V}`);
      }
      slot.tokens.data.set(input);
      if (this.shape.arch.position === 'learned') L.embeddingForward(k, slot.inputAct, slot.tokens, P.get('wte'), P.get('wpe'), B, T, C);
      else this.gatherEmbeddings(slot.inputAct, input);
    } else {
      if (!(input instanceof Float32Array) || input.length !== N * C) throw new TypeError(`stage takes an activation of ${N}×${C} floats`);
      slot.inputAct.data.set(input);
    }
    if (this.rope) sequencePositions(this.rope.positions.buffer, B, T);
    for (let i = 0; i < slot.blocks.length; i++) {
      blockForward(k, this.shape, this.blockTensors(P, this.blockIds[i]), slot.blocks[i], this.scratch.tmp, this.rope, B, T, slot.lora[i] ?? null);
    }
    if (!this.isLast) return this.streamOut(slot).data.subarray(0, N * C);
    const x = this.streamOut(slot);
    headNormForward(k, this.shape, this.headTensors(P), slot.lnf!, slot.lnfMean!, slot.lnfRstd!, x, N);
    L.linearForward(k, slot.logits!, slot.lnf!, P.get('lm_head.w'), null, N, C, V);
    if (!targets) return slot.logits!.data.subarray(0, N * V);
    if (targets.length !== N) throw new TypeError(`last stage takes ${N} targets`);
    for (let i = 0; i < N; i++) {
      if (!(targets[i] >= 0 && targets[i] < V)) throw new RangeError(`target ${targets[i]} at ${i} outside the vocabulary`);
    }
    slot.targets.data.set(targets);
    return L.crossEntropyForward(k, slot.losses!, slot.probs!, slot.logits!, slot.targets, N, V);
  }

  /** Per-position losses of a slot's last forward pass with targets (last stage). */
  lossesView(slotIndex = 0): Float32Array {
    if (!this.isLast) throw new Error('only the last stage has losses');
    const slot = this.slot(slotIndex);
    return slot.losses!.data.subarray(0, slot.B * slot.T);
  }

  /**
   * Backward pass of the last forward. The last stage starts from its loss
   * (dOutput omitted); other stages take the gradient of their output.
   * Parameter gradients accumulate (+=) into `grads`. Returns the gradient of
   * the input activation (a view, valid until the next call), or null for the
   * first stage.
   */
  backward(dOutput?: Float32Array, slotIndex = 0): Float32Array | null {
    this.checkAlive();
    const slot = this.slot(slotIndex);
    const { channels: C, vocabSize: V } = this.config;
    const B = slot.B, T = slot.T, N = B * T;
    if (N === 0) throw new Error('backward before forward');
    const k = this.engine.kernels;
    const P = this.weights, G = this.grads;
    const { dres, dsmall } = this.scratch;
    if (this.isLast) {
      if (dOutput) throw new TypeError('the last stage starts backward from its loss');
      L.crossEntropyBackward(k, this.dlogits!, slot.probs!, slot.targets, N, V);
      if (this.lora) frozenLinearBackward(k, dsmall, this.dlogits!, P.get('lm_head.w'), N, C, V);
      else L.linearBackward(k, dsmall, G.get('lm_head.w'), null, this.dlogits!, slot.lnf!, P.get('lm_head.w'), N, C, V);
      dres.data.fill(0, 0, N * C);
      headNormBackward(k, this.shape, this.headTensors(P), this.headTensors(G), dres, dsmall, this.streamOut(slot), slot.lnfMean!, slot.lnfRstd!, N);
    } else {
      if (!dOutput || dOutput.length !== N * C) throw new TypeError(`stage backward takes a gradient of ${N}×${C} floats`);
      dres.data.set(dOutput);
    }
    if (this.rope) sequencePositions(this.rope.positions.buffer, B, T);
    for (let i = slot.blocks.length - 1; i >= 0; i--) {
      const l = this.blockIds[i];
      blockBackward(k, this.shape, this.blockTensors(P, l), this.blockTensors(G, l), slot.blocks[i], this.scratch, this.rope, B, T, slot.lora[i] ?? null);
    }
    if (this.isFirst) {
      if (this.lora) return null;
      if (this.shape.arch.position === 'learned') L.embeddingBackward(k, G.get('wte'), G.get('wpe'), dres, slot.tokens, B, T, C);
      else this.scatterEmbeddingGrads(G.get('wte'), dres, slot.tokens.data.subarray(0, N));
      return null;
    }
    return dres.data.subarray(0, N * C);
  }

  zeroGrad(): void {
    this.grads.flat.data.fill(0);
  }

  /** Frees every buffer of this stage. */
  release(): void {
    if (this.released) return;
    this.released = true;
    for (const t of this.tensors) this.engine.free(t);
    this.engine.free(this.params.flat);
    this.engine.free(this.grads.flat);
    if (this.base) this.engine.free(this.base.flat);
    for (const b of this.ints) this.engine.free(b);
  }

  private checkAlive(): void {
    if (this.released) throw new Error('stage was released');
  }

  /** Block l's parameters (or gradients) by their name within the block; null for what the layout lacks (a bias this architecture has not). */
  private blockTensors(F: FlatTensors, l: number): BlockTensors {
    const p = `h.${l}.`;
    return (name) => (F.layout.byName.has(p + name) ? F.get(p + name) : null);
  }

  private headTensors(F: FlatTensors): BlockTensors {
    return (name) => (F.layout.byName.has(name) ? F.get(name) : null);
  }

  /** out[r] = wte[token r] (rotary positions: no position embedding). */
  private gatherEmbeddings(out: Tensor, tokens: Int32Array): void {
    const C = this.config.channels;
    const wte = this.weights.get('wte').data;
    for (let r = 0; r < tokens.length; r++) out.data.set(wte.subarray(tokens[r] * C, (tokens[r] + 1) * C), r * C);
  }

  /** dwte[token r] += dout[r] */
  private scatterEmbeddingGrads(dwte: Tensor, dout: Tensor, tokens: Int32Array): void {
    const C = this.config.channels;
    const g = dwte.data, d = dout.data;
    for (let r = 0; r < tokens.length; r++) {
      const o = tokens[r] * C, i = r * C;
      for (let c = 0; c < C; c++) g[o + c] += d[i + c];
    }
  }
}
