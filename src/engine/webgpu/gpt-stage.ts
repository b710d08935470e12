// A range of a GPT's parts on the GPU, forward and backward, as
// src/model/gpt.ts GptStage runs it on WASM: the embeddings on a first stage,
// some blocks, the head and the loss on a last stage. It mirrors GptStage call
// for call: the same layers in the same order, the same accumulate-or-overwrite
// rules (gradients accumulate, += , until cleared), the same flat layout (the
// caller's ParamLayout) and activation slots (a microbatch's activations stay
// in its slot from its forward to its backward). Differences, all forced by
// WebGPU or by the GPU kernels: attention saves its row stats instead of the
// probability matrix (attention.ts), the GELU backward writes a second buffer
// instead of in place, and each activation has a buffer of its own
// (gpt-buffers.ts).
//
// Every call only queues work: nothing waits for the GPU until something is
// read back (readOutput, readLoss, readDInput, readGrads), and a read sees
// all the work queued before it, whatever is queued after. Each kernel helper
// submits its own dispatch (its parameter block is one uniform buffer,
// rewritten before each submission), queued back to back.
import { GpuAttention } from './attention.ts';
import { readArray, uploadArray, writeArray, type GpuArray } from './buffers.ts';
import { uploadTokens, type GpuTokens } from './embedding.ts';
import { GpuGemm } from './gemm.ts';
import { checkLayout, clearRef, createScratch, createSlotActs, GpuFlat, type FlatLayout, type GpuBlockActs, type GpuScratch, type GpuSlotActs, type GptParts, type GptShape } from './gpt-buffers.ts';
import { GpuKernelSet } from './kernel-set.ts';
import { linearBackward, linearForward } from './linear.ts';
import { uploadIndices } from './program.ts';

export interface GpuGptStageOptions {
  /** sequences per microbatch at most (each of the config's context length) */
  batchSize: number;
  /** microbatches held between forward and backward at once (default 1) */
  slots?: number;
}

interface Slot {
  acts: GpuSlotActs;
  /** the first stage's token ids, kept for the embedding's backward */
  tokens: GpuTokens | null;
  /** the last stage's targets, kept for the loss's backward */
  targets: GpuArray | null;
  /** sequences in the slot's last forward (0: none yet) */
  B: number;
}

export class GpuGptStage {
  readonly params: GpuFlat;
  readonly grads: GpuFlat;
  private readonly slots: Slot[];
  private readonly scratch: GpuScratch;
  private destroyed = false;

  private constructor(
    readonly device: GPUDevice,
    readonly config: GptShape,
    readonly parts: GptParts,
    readonly layout: FlatLayout,
    readonly batchSize: number,
    slots: number,
    /** the compiled kernels (the optimizer's too: gpt-step.ts uses them) */
    readonly kernels: GpuKernelSet,
    private readonly gemm: GpuGemm,
    private readonly attention: GpuAttention,
    params: Float32Array,
  ) {
    const n = layout.size;
    // what is made before an allocation fails (past the adapter's limits) is freed, with the kernels
    const owned: GpuArray[] = [];
    try {
      this.params = new GpuFlat(layout, uploadArray(device, params, 'params'));
      owned.push(this.params.array);
      this.grads = new GpuFlat(layout, uploadArray(device, new Float32Array(n), 'grads'));
      owned.push(this.grads.array);
      this.slots = Array.from({ length: slots }, () => ({ acts: createSlotActs(device, config, batchSize, parts, owned), tokens: null, targets: null, B: 0 }));
      this.scratch = createScratch(device, config, batchSize, parts, owned);
    } catch (err) {
      for (const a of owned) a.destroy();
      kernels.destroy();
      gemm.destroy();
      attention.destroy();
      throw err;
    }
  }

  /**
   * Compiles the kernels and uploads the parameters. `layout` is the
   * stage's own layout (a GptStage's `layout`, src/model/params.ts), which
   * must hold exactly the tensors of `parts`; `params` is laid out by it.
   */
  static async create(device: GPUDevice, config: GptShape, parts: GptParts, layout: FlatLayout, params: Float32Array, options: GpuGptStageOptions): Promise<GpuGptStage> {
    checkLayout(layout, config, parts);
    if (params.length !== layout.size) throw new RangeError(`gpt stage: ${params.length} parameters given, the layout holds ${layout.size}`);
    if (config.channels % config.heads !== 0) throw new RangeError(`gpt stage: ${config.heads} heads do not divide ${config.channels} channels`);
    if (!Number.isInteger(options.batchSize) || options.batchSize < 1) throw new RangeError(`gpt stage: batch size ${options.batchSize}`);
    const slots = options.slots ?? 1;
    if (!Number.isInteger(slots) || slots < 1) throw new RangeError(`gpt stage: slots must be a positive integer, got ${slots}`);
    const [k, gemm, attention] = await Promise.all([GpuKernelSet.create(device), GpuGemm.create(device), GpuAttention.create(device, config.channels / config.heads)]);
    return new GpuGptStage(device, config, parts, layout, options.batchSize, slots, k, gemm, attention, params);
  }

  get slotCount(): number {
    return this.slots.length;
  }

  /** Replaces the parameters (queued: work queued later uses them, work queued earlier does not). */
  writeParams(values: Float32Array): void {
    this.checkAlive();
    if (values.length !== this.layout.size) throw new RangeError(`gpt stage: ${values.length} parameters for a layout of ${this.layout.size}`);
    writeArray(this.device, this.params.array, values);
  }

  /** Queues zeroes over the gradients. */
  clearGrads(): void {
    this.checkAlive();
    clearRef(this.device, this.grads.array, this.layout.size);
  }

  /** The parameters as queued work leaves them. */
  readParams(): Promise<Float32Array> {
    return readArray(this.device, this.params.array);
  }

  /** The gradients as queued work leaves them. */
  readGrads(): Promise<Float32Array> {
    return readArray(this.device, this.grads.array);
  }

  /**
   * Queues the forward of B sequences of T tokens (T ≤ context) into `slot`:
   * from token ids (first stage) or the activation [B·T·C] of the stage before.
   * A last stage also takes the targets and computes the per-row losses.
   */
  forward(input: Int32Array | Float32Array, B: number, T: number, targets: Int32Array | undefined, slotIndex: number): void {
    this.checkAlive();
    const slot = this.slot(slotIndex);
    const { channels: C, vocabSize: V, contextLength } = this.config;
    // the kernels are built for the full context (attention's rows, wpe's rows): a shorter T is not run here
    if (!Number.isInteger(B) || B < 1 || B > this.batchSize || T !== contextLength) throw new RangeError(`gpt stage: batch ${B}×${T}, this stage runs 1..${this.batchSize} × ${contextLength}`);
    const N = B * T;
    if (this.parts.last && !targets) throw new TypeError('gpt stage: the last stage takes targets');
    if (targets && targets.length !== N) throw new TypeError(`gpt stage: the last stage takes ${N} targets`);
    slot.tokens?.destroy();
    slot.targets?.destroy();
    slot.tokens = null;
    slot.targets = null;
    slot.B = 0;
    const P = this.params, a = slot.acts;
    if (this.parts.first) {
      if (!(input instanceof Int32Array) || input.length !== N) throw new TypeError(`gpt stage: the first stage takes ${N} token ids`);
      slot.tokens = uploadTokens(this.device, input, V);
      this.kernels.embedding.embeddingForward(a.inputAct, slot.tokens, P.ref('wte'), P.ref('wpe'), B, T, C);
    } else {
      if (!(input instanceof Float32Array) || input.length !== N * C) throw new TypeError(`gpt stage: the stage takes an activation of ${N}×${C} floats`);
      writeArray(this.device, a.inputAct, input);
    }
    a.blocks.forEach((blk, i) => this.blockForward(this.parts.blocks[i], blk, B));
    if (this.parts.last) {
      slot.targets = uploadIndices(this.device, targets!, V, 'targets');
      const h = a.head!;
      this.k.rows.layernormForward(h.lnf, h.lnfMean, h.lnfRstd, this.streamOut(a), P.ref('lnf.w'), P.ref('lnf.b'), N, C);
      this.linearForward(h.logits, h.lnf, 'lm_head.w', null, N, C, V);
      this.k.rows.crossEntropyForward(h.losses, h.probs, h.logits, slot.targets, N, V);
    }
    slot.B = B;
  }

  /** The activation a forward left in `slot` (not last stage), read back: [B·T·C]. */
  readOutput(slotIndex: number): Promise<Float32Array> {
    const slot = this.ran(slotIndex);
    if (this.parts.last) throw new Error('gpt stage: the last stage ends in a loss');
    return readArray(this.device, this.streamOut(slot.acts), 0, slot.B * this.config.contextLength * this.config.channels);
  }

  /** The per-row losses of `slot`'s forward (last stage), read back. */
  readLosses(slotIndex: number): Promise<Float32Array> {
    const slot = this.ran(slotIndex);
    if (!slot.acts.head) throw new Error('gpt stage: only the last stage has losses');
    return readArray(this.device, slot.acts.head.losses, 0, slot.B * this.config.contextLength);
  }

  /** The mean loss of `slot`'s forward: the float64 mean of the float32 row losses, as the WASM layer computes it. */
  async readLoss(slotIndex: number): Promise<number> {
    const losses = await this.readLosses(slotIndex);
    let sum = 0;
    for (let i = 0; i < losses.length; i++) sum += losses[i];
    return sum / losses.length;
  }

  /**
   * Queues the backward of the microbatch in `slot`. The last stage starts
   * from its loss (dOutput omitted); other stages take the gradient of their
   * output [B·T·C]. Parameter gradients accumulate (+=). The gradient of the
   * stage's input is left for readDInput (not on a first stage).
   */
  backward(dOutput: Float32Array | undefined, slotIndex: number): void {
    this.checkAlive();
    const slot = this.ran(slotIndex);
    const { contextLength: T, channels: C, vocabSize: V } = this.config;
    const B = slot.B, N = B * T, a = slot.acts, s = this.scratch;
    if (this.parts.last) {
      if (dOutput) throw new TypeError('gpt stage: the last stage starts backward from its loss');
      const h = a.head!;
      this.k.rows.crossEntropyBackward(s.dlogits!, h.probs, slot.targets!, 1 / N, N, V);
      this.linearBackward(s.dsmall, 'lm_head.w', null, s.dlogits!, h.lnf, N, C, V);
      clearRef(this.device, s.dres, N * C);
      this.layernormBackward(s.dres, 'lnf.w', 'lnf.b', s.dsmall, this.streamOut(a), h.lnfMean, h.lnfRstd, N);
    } else {
      if (!dOutput || dOutput.length !== N * C) throw new TypeError(`gpt stage: backward takes a gradient of ${N}×${C} floats`);
      writeArray(this.device, s.dres, dOutput);
    }
    for (let i = a.blocks.length - 1; i >= 0; i--) this.blockBackward(this.parts.blocks[i], a.blocks[i], B);
    if (this.parts.first) this.kernels.embedding.embeddingBackward(this.grads.ref('wte'), this.grads.ref('wpe'), s.dres, slot.tokens!, B, T, C);
  }

  /** The gradient of the stage's input left by the last backward of `slot`'s shape, read back (null on a first stage). */
  readDInput(slotIndex: number): Promise<Float32Array> | null {
    const slot = this.ran(slotIndex);
    if (this.parts.first) return null;
    return readArray(this.device, this.scratch.dres, 0, slot.B * this.config.contextLength * this.config.channels);
  }

  /** Frees every buffer and kernel of the stage. */
  destroy(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    for (const s of this.slots) {
      for (const a of s.acts.all) a.destroy();
      s.tokens?.destroy();
      s.targets?.destroy();
    }
    for (const a of [...this.scratch.all, this.params.array, this.grads.array]) a.destroy();
    this.kernels.destroy();
    this.gemm.destroy();
    this.attention.destroy();
  }

  private get k(): GpuKernelSet {
    return this.kernels;
  }

  private checkAlive(): void {
    if (this.destroyed) throw new Error('gpt stage was destroyed');
  }

  private slot(index: number): Slot {
    const s = this.slots[index];
    if (!s) throw new RangeError(`gpt stage: slot ${index} outside the stage's ${this.slots.length} slots`);
    return s;
  }

  /** A slot that holds a forward. */
  private ran(index: number): Slot {
    this.checkAlive();
    const s = this.slot(index);
    if (s.B === 0) throw new Error(`gpt stage: slot ${index} holds no forward`);
    return s;
  }

  /** The residual stream leaving the last block (or entering the stage, when it holds none). */
  private streamOut(a: GpuSlotActs): GpuArray {
    return a.blocks.length ? a.blocks[a.blocks.length - 1].out : a.inputAct;
  }

  private linearForward(out: GpuArray, inp: GpuArray, w: string, b: string | null, N: number, C: number, OC: number): void {
    linearForward(this.gemm, this.params, out, inp, w, b, N, C, OC);
  }

  private linearBackward(dinp: GpuArray, w: string, b: string | null, dout: GpuArray, inp: GpuArray, N: number, C: number, OC: number): void {
    linearBackward({ gemm: this.gemm, rows: this.k.rows }, this.params, this.grads, dinp, w, b, dout, inp, N, C, OC);
  }

  /** dinp += ; dw, db += : layernormBackward of src/model/layers.ts */
  private layernormBackward(dinp: GpuArray, w: string, b: string, dout: GpuArray, inp: GpuArray, mean: GpuArray, rstd: GpuArray, N: number): void {
    const C = this.config.channels;
    this.k.rows.layernormBackwardInput(dinp, dout, inp, this.params.ref(w), mean, rstd, N, C);
    this.k.rows.layernormBackwardParams(this.grads.ref(w), this.grads.ref(b), dout, inp, mean, rstd, N, C);
  }

  private blockForward(l: number, a: GpuBlockActs, B: number): void {
    const { contextLength: T, channels: C, heads: NH } = this.config;
    const H = C * this.config.mlpRatio, N = B * T, P = this.params, p = `h.${l}.`, tmp = this.scratch.tmp;
    const rows = this.k.rows, ew = this.k.elementwise;
    rows.layernormForward(a.ln1, a.ln1Mean, a.ln1Rstd, a.input, P.ref(p + 'ln1.w'), P.ref(p + 'ln1.b'), N, C);
    this.linearForward(a.qkv, a.ln1, p + 'attn.qkv.w', p + 'attn.qkv.b', N, C, 3 * C);
    this.attention.forward({ qkv: a.qkv, out: a.atty, stats: a.stats, B, T, C, NH });
    this.linearForward(tmp, a.atty, p + 'attn.proj.w', p + 'attn.proj.b', N, C, C);
    ew.add(a.res2, a.input, tmp, N * C);
    rows.layernormForward(a.ln2, a.ln2Mean, a.ln2Rstd, a.res2, P.ref(p + 'ln2.w'), P.ref(p + 'ln2.b'), N, C);
    this.linearForward(a.fch, a.ln2, p + 'mlp.fc.w', p + 'mlp.fc.b', N, C, H);
    ew.geluForward(a.fchGelu, a.fch, N * H);
    this.linearForward(tmp, a.fchGelu, p + 'mlp.proj.w', p + 'mlp.proj.b', N, H, C);
    ew.add(a.out, a.res2, tmp, N * C);
  }

  /** dres holds d(out); on return it holds d(input). */
  private blockBackward(l: number, a: GpuBlockActs, B: number): void {
    const { contextLength: T, channels: C, heads: NH } = this.config;
    const H = C * this.config.mlpRatio, N = B * T, p = `h.${l}.`;
    const { dres, dsmall, dqkv, dbig, dbig2 } = this.scratch;
    // out = res2 + mlp(ln2(res2)): the residual passes dres through unchanged
    this.linearBackward(dbig, p + 'mlp.proj.w', p + 'mlp.proj.b', dres, a.fchGelu, N, H, C);
    this.k.elementwise.geluBackward(dbig2, a.fch, dbig, N * H);
    this.linearBackward(dsmall, p + 'mlp.fc.w', p + 'mlp.fc.b', dbig2, a.ln2, N, C, H);
    this.layernormBackward(dres, p + 'ln2.w', p + 'ln2.b', dsmall, a.res2, a.ln2Mean, a.ln2Rstd, N);
    // res2 = input + proj(attn(ln1(input)))
    this.linearBackward(dsmall, p + 'attn.proj.w', p + 'attn.proj.b', dres, a.atty, N, C, C);
    this.attention.backward({ dqkv, dout: dsmall, qkv: a.qkv, out: a.atty, stats: a.stats, B, T, C, NH });
    this.linearBackward(dsmall, p + 'attn.qkv.w', p + 'attn.qkv.b', dqkv, a.ln1, N, C, 3 * C);
    this.layernormBackward(dres, p + 'ln1.w', p + 'ln1.b', dsmall, a.input, a.ln1Mean, a.ln1Rstd, N);
  }
}
