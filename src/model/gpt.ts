// The GPT as a list of parts: [embedding, block 0 … block L−1, final norm +
// head]. A stage is any contiguous range of parts; the whole model is the
// stage [0, L+2). Each stage owns its parameters, gradients and activations as
// flat buffers in the engine memory, runs forward from token ids (first stage)
// or an activation, and backward from the loss (last stage) or an upstream
// activation gradient. The head is untied from the token embedding, so the
// first and last stage share no weights and can live on different machines.
import { Type, type Static } from '@sinclair/typebox';
import type { Engine } from '../engine/engine.ts';
import { numel, type Tensor } from '../engine/tensor.ts';
import { type GptConfig, validateGptConfig } from './config.ts';
import { initParams } from './init.ts';
import * as L from './layers.ts';
import { FlatTensors, ParamLayout, type InitKind, type ParamSpec } from './params.ts';

/** The parts [from, to) a stage holds; a schema too, for plans and assignments read back from storage or peers. */
export const StageRange = Type.Object({
  /** first part, inclusive */
  from: Type.Integer({ minimum: 0 }),
  /** last part, exclusive */
  to: Type.Integer({ minimum: 1 }),
});
export type StageRange = Static<typeof StageRange>;

/** Number of parts: embedding, the blocks, the head. */
export function partCount(config: GptConfig): number {
  return config.layers + 2;
}

/** The last part (final norm + head). Part 0 is the embedding; the blocks are parts 1 … headPart − 1. */
export function headPart(config: GptConfig): number {
  return partCount(config) - 1;
}

/** What a range holds: the embedding (first stage), the blocks by index, the head (last stage). */
export function rangeParts(config: GptConfig, range: StageRange): { first: boolean; last: boolean; blocks: number[] } {
  const blocks: number[] = [];
  for (let p = Math.max(1, range.from); p < Math.min(range.to, headPart(config)); p++) blocks.push(p - 1);
  return { first: range.from === 0, last: range.to === partCount(config), blocks };
}

export function partName(config: GptConfig, part: number): string {
  if (part === 0) return 'embedding';
  if (part === headPart(config)) return 'head';
  return `block ${part - 1}`;
}

const STD = 0.02;

/** Parameter specs of one part, named as in the checkpoint. */
export function partParams(config: GptConfig, part: number): ParamSpec[] {
  const { vocabSize: V, contextLength: T, channels: C, layers } = config;
  const H = C * config.mlpRatio;
  const torch = (config.init ?? 'torch') === 'torch';
  const zeros = { kind: 'zeros' } as const;
  const ones = { kind: 'ones' } as const;
  const embedding: InitKind = torch ? { kind: 'normal', std: 1 } : { kind: 'normal', std: STD };
  /** a linear layer's weight and bias inits, by fan-in */
  const linear = (fanIn: number, residual = false): [InitKind, InitKind] => {
    if (torch) {
      const bound = 1 / Math.sqrt(fanIn);
      return [{ kind: 'uniform', bound }, { kind: 'uniform', bound }];
    }
    return [{ kind: 'normal', std: residual ? STD / Math.sqrt(2 * layers) : STD }, zeros];
  };
  if (part === 0) {
    return [
      { name: 'wte', shape: [V, C], decay: true, init: embedding },
      { name: 'wpe', shape: [T, C], decay: true, init: embedding },
    ];
  }
  if (part === headPart(config)) {
    return [
      { name: 'lnf.w', shape: [C], decay: false, init: ones },
      { name: 'lnf.b', shape: [C], decay: false, init: zeros },
      { name: 'lm_head.w', shape: [C, V], decay: true, init: linear(C)[0] },
    ];
  }
  if (part < 0 || part >= partCount(config)) throw new RangeError(`no part ${part}`);
  const p = `h.${part - 1}.`;
  const [qkvW, qkvB] = linear(C);
  const [projW, projB] = linear(C, true);
  const [fcW, fcB] = linear(C);
  const [mprojW, mprojB] = linear(H, true);
  return [
    { name: p + 'ln1.w', shape: [C], decay: false, init: ones },
    { name: p + 'ln1.b', shape: [C], decay: false, init: zeros },
    { name: p + 'attn.qkv.w', shape: [C, 3 * C], decay: true, init: qkvW },
    { name: p + 'attn.qkv.b', shape: [3 * C], decay: false, init: qkvB },
    { name: p + 'attn.proj.w', shape: [C, C], decay: true, init: projW },
    { name: p + 'attn.proj.b', shape: [C], decay: false, init: projB },
    { name: p + 'ln2.w', shape: [C], decay: false, init: ones },
    { name: p + 'ln2.b', shape: [C], decay: false, init: zeros },
    { name: p + 'mlp.fc.w', shape: [C, H], decay: true, init: fcW },
    { name: p + 'mlp.fc.b', shape: [H], decay: false, init: fcB },
    { name: p + 'mlp.proj.w', shape: [H, C], decay: true, init: mprojW },
    { name: p + 'mlp.proj.b', shape: [C], decay: false, init: mprojB },
  ];
}

/** Parameter count of one part. */
export function partParamCount(config: GptConfig, part: number): number {
  let n = 0;
  for (const s of partParams(config, part)) n += numel(s.shape);
  return n;
}

/** Parameter count of a range of parts. */
export function rangeParamCount(config: GptConfig, range: StageRange): number {
  let n = 0;
  for (let p = range.from; p < range.to; p++) n += partParamCount(config, p);
  return n;
}

/** Splits the parts into `stages` contiguous ranges of near-equal parameter count. */
export function splitEvenly(config: GptConfig, stages: number): StageRange[] {
  const parts = partCount(config);
  if (!Number.isInteger(stages) || stages < 1 || stages > parts) {
    throw new RangeError(`cannot cut ${parts} parts into ${stages} stages`);
  }
  const sizes = Array.from({ length: parts }, (_, p) => partParamCount(config, p));
  const total = sizes.reduce((a, b) => a + b, 0);
  const ranges: StageRange[] = [];
  let from = 0;
  let acc = 0;
  for (let s = 0; s < stages; s++) {
    const left = stages - s - 1;
    let to = from + 1;
    acc += sizes[from];
    const target = (total * (s + 1)) / stages;
    while (to < parts - left && acc + sizes[to] / 2 <= target) acc += sizes[to++];
    if (s === stages - 1) to = parts;
    ranges.push({ from, to });
    from = to;
  }
  return ranges;
}

interface BlockActs {
  input: Tensor;
  ln1: Tensor; ln1Mean: Tensor; ln1Rstd: Tensor;
  qkv: Tensor; att: Tensor; atty: Tensor;
  res2: Tensor;
  ln2: Tensor; ln2Mean: Tensor; ln2Rstd: Tensor;
  fch: Tensor; fchGelu: Tensor;
  out: Tensor;
}

/** Everything one microbatch in flight keeps between forward and backward. */
interface SlotActs {
  tokens: L.IntBuffer;
  targets: L.IntBuffer;
  inputAct: Tensor;
  blocks: BlockActs[];
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
  const specs: ParamSpec[] = [];
  for (let p = range.from; p < range.to; p++) specs.push(...partParams(config, p));
  const layout = new ParamLayout(specs);
  const params = new FlatTensors(layout, engine);
  const grads = new FlatTensors(layout, engine);
  initParams(layout, params.flat.data, seed);
  return { layout, params, grads };
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
}

export class GptStage {
  readonly layout: ParamLayout;
  readonly params: FlatTensors;
  readonly grads: FlatTensors;
  readonly isFirst: boolean;
  readonly isLast: boolean;
  readonly maxBatch: number;
  private readonly engine: Engine;
  private readonly tensors: Tensor[] = [];
  private readonly ints: L.IntBuffer[] = [];
  private readonly slots: SlotActs[] = [];
  private readonly blockIds: number[] = [];
  // backward scratch, shared by the slots
  private readonly dres: Tensor;
  private readonly dsmall: Tensor;
  private readonly dqkv: Tensor;
  private readonly dbig: Tensor;
  private readonly dlogits?: Tensor;
  private readonly tmp: Tensor;
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
    ({ layout: this.layout, params: this.params, grads: this.grads } = createStageParams(engine, config, range, options.seed ?? 1337));

    const { contextLength: T, channels: C, heads: NH, vocabSize: V } = config;
    const B = options.batchSize;
    const N = B * T;
    const H = C * config.mlpRatio;
    const t = (shape: number[]): Tensor => {
      const x = engine.tensor(shape);
      this.tensors.push(x);
      return x;
    };
    this.blockIds.push(...rangeParts(config, range).blocks);
    const slotCount = options.slots ?? 1;
    if (!Number.isInteger(slotCount) || slotCount < 1) throw new RangeError(`slots must be a positive integer, got ${slotCount}`);
    for (let i = 0; i < slotCount; i++) {
      const tokens = engine.int32(N);
      const targets = engine.int32(N);
      this.ints.push(tokens, targets);
      const slot: SlotActs = { tokens, targets, inputAct: t([N, C]), blocks: [], B: 0, T: 0 };
      let prev = slot.inputAct;
      for (let b = 0; b < this.blockIds.length; b++) {
        const a: BlockActs = {
          input: prev,
          ln1: t([N, C]), ln1Mean: t([N]), ln1Rstd: t([N]),
          qkv: t([N, 3 * C]), att: t([B, NH, T, T]), atty: t([N, C]),
          res2: t([N, C]),
          ln2: t([N, C]), ln2Mean: t([N]), ln2Rstd: t([N]),
          fch: t([N, H]), fchGelu: t([N, H]),
          out: t([N, C]),
        };
        slot.blocks.push(a);
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
    this.dres = t([N, C]);
    this.dsmall = t([N, C]);
    this.dqkv = t([N, 3 * C]);
    this.dbig = t([N, H]);
    this.tmp = t([N, C]);
  }

  /** Parameters in this stage. */
  get paramCount(): number {
    return this.layout.size;
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
   */
  forward(input: Int32Array | Float32Array, B: number, T: number, targets?: Int32Array, slotIndex = 0): Float32Array | number {
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
    const P = this.params;
    if (this.isFirst) {
      if (!(input instanceof Int32Array) || input.length !== N) throw new TypeError(`first stage takes ${N} token ids`);
      for (let i = 0; i < N; i++) {
        const tok = input[i];
        if (!(tok >= 0 && tok < V)) throw new RangeError(`token ${tok} at ${i} outside the vocabulary of ${V}`);
      }
      slot.tokens.data.set(input);
      L.embeddingForward(k, slot.inputAct, slot.tokens, P.get('wte'), P.get('wpe'), B, T, C);
    } else {
      if (!(input instanceof Float32Array) || input.length !== N * C) throw new TypeError(`stage takes an activation of ${N}×${C} floats`);
      slot.inputAct.data.set(input);
    }
    for (let i = 0; i < slot.blocks.length; i++) this.blockForward(this.blockIds[i], slot.blocks[i], B, T);
    if (!this.isLast) return this.streamOut(slot).data.subarray(0, N * C);
    const x = this.streamOut(slot);
    L.layernormForward(k, slot.lnf!, slot.lnfMean!, slot.lnfRstd!, x, P.get('lnf.w'), P.get('lnf.b'), N, C);
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
    const P = this.params, G = this.grads;
    const dres = this.dres;
    if (this.isLast) {
      if (dOutput) throw new TypeError('the last stage starts backward from its loss');
      L.crossEntropyBackward(k, this.dlogits!, slot.probs!, slot.targets, N, V);
      L.linearBackward(k, this.dsmall, G.get('lm_head.w'), null, this.dlogits!, slot.lnf!, P.get('lm_head.w'), N, C, V);
      dres.data.fill(0, 0, N * C);
      L.layernormBackward(k, dres, G.get('lnf.w'), G.get('lnf.b'), this.dsmall, this.streamOut(slot), P.get('lnf.w'), slot.lnfMean!, slot.lnfRstd!, N, C);
    } else {
      if (!dOutput || dOutput.length !== N * C) throw new TypeError(`stage backward takes a gradient of ${N}×${C} floats`);
      dres.data.set(dOutput);
    }
    for (let i = slot.blocks.length - 1; i >= 0; i--) this.blockBackward(this.blockIds[i], slot.blocks[i], B, T);
    if (this.isFirst) {
      L.embeddingBackward(k, G.get('wte'), G.get('wpe'), dres, slot.tokens, B, T, C);
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
    for (const b of this.ints) this.engine.free(b);
  }

  private checkAlive(): void {
    if (this.released) throw new Error('stage was released');
  }

  private blockForward(l: number, a: BlockActs, B: number, T: number): void {
    const { channels: C, heads: NH } = this.config;
    const H = C * this.config.mlpRatio;
    const N = B * T;
    const k = this.engine.kernels;
    const P = this.params;
    const p = `h.${l}.`;
    L.layernormForward(k, a.ln1, a.ln1Mean, a.ln1Rstd, a.input, P.get(p + 'ln1.w'), P.get(p + 'ln1.b'), N, C);
    L.linearForward(k, a.qkv, a.ln1, P.get(p + 'attn.qkv.w'), P.get(p + 'attn.qkv.b'), N, C, 3 * C);
    L.attentionForward(k, a.atty, a.att, a.qkv, B, T, C, NH);
    L.linearForward(k, this.tmp, a.atty, P.get(p + 'attn.proj.w'), P.get(p + 'attn.proj.b'), N, C, C);
    L.residualForward(k, a.res2, a.input, this.tmp, N * C);
    L.layernormForward(k, a.ln2, a.ln2Mean, a.ln2Rstd, a.res2, P.get(p + 'ln2.w'), P.get(p + 'ln2.b'), N, C);
    L.linearForward(k, a.fch, a.ln2, P.get(p + 'mlp.fc.w'), P.get(p + 'mlp.fc.b'), N, C, H);
    L.geluForward(k, a.fchGelu, a.fch, N * H);
    L.linearForward(k, this.tmp, a.fchGelu, P.get(p + 'mlp.proj.w'), P.get(p + 'mlp.proj.b'), N, H, C);
    L.residualForward(k, a.out, a.res2, this.tmp, N * C);
  }

  /** dres holds d(out); on return it holds d(input). */
  private blockBackward(l: number, a: BlockActs, B: number, T: number): void {
    const { channels: C, heads: NH } = this.config;
    const H = C * this.config.mlpRatio;
    const N = B * T;
    const k = this.engine.kernels;
    const P = this.params, G = this.grads;
    const p = `h.${l}.`;
    const dres = this.dres;
    // out = res2 + mlp(ln2(res2)): the residual passes dres through unchanged
    L.linearBackward(k, this.dbig, G.get(p + 'mlp.proj.w'), G.get(p + 'mlp.proj.b'), dres, a.fchGelu, P.get(p + 'mlp.proj.w'), N, H, C);
    L.geluBackward(k, this.dbig, a.fch, this.dbig, N * H);
    L.linearBackward(k, this.dsmall, G.get(p + 'mlp.fc.w'), G.get(p + 'mlp.fc.b'), this.dbig, a.ln2, P.get(p + 'mlp.fc.w'), N, C, H);
    L.layernormBackward(k, dres, G.get(p + 'ln2.w'), G.get(p + 'ln2.b'), this.dsmall, a.res2, P.get(p + 'ln2.w'), a.ln2Mean, a.ln2Rstd, N, C);
    // res2 = input + proj(attn(ln1(input)))
    L.linearBackward(k, this.dsmall, G.get(p + 'attn.proj.w'), G.get(p + 'attn.proj.b'), dres, a.atty, P.get(p + 'attn.proj.w'), N, C, C);
    L.attentionBackward(k, this.dqkv, this.dsmall, a.qkv, a.att, B, T, C, NH);
    L.linearBackward(k, this.dsmall, G.get(p + 'attn.qkv.w'), G.get(p + 'attn.qkv.b'), this.dqkv, a.ln1, P.get(p + 'attn.qkv.w'), N, C, 3 * C);
    L.layernormBackward(k, dres, G.get(p + 'ln1.w'), G.get(p + 'ln1.b'), this.dsmall, a.input, P.get(p + 'ln1.w'), a.ln1Mean, a.ln1Rstd, N, C);
  }
}
