// A whole GPT training step on the GPU: zero the gradients, forward from
// token ids to the loss, backward to the embeddings, the gradient norm, and
// AdamW, with every tensor staying on the GPU. It mirrors src/model/gpt.ts
// (GptStage over the whole model) call for call: the same layers in the same
// order, the same accumulate-or-overwrite rules, the same flat layout
// (wholeModelLayout), the same clipping (src/model/adamw.ts). Differences,
// all forced by WebGPU or by the GPU kernels: attention saves its row stats
// instead of the probability matrix (attention.ts), the GELU backward writes
// a second buffer instead of in place, and each activation has a buffer of
// its own (gpt-buffers.ts).
//
// Each kernel helper submits its own dispatch (its parameter block is one
// uniform buffer, rewritten before each submission), so a step is one
// submission per kernel call, queued back to back with no wait. The step waits
// once: for the per-row losses and the gradient norm's chunk partials, which
// the CPU adds in float64 in a fixed order, as the WASM engine does, to decide
// the clipping scale before AdamW is queued.
import { NORM_CHUNK, type AdamWArgs } from '../kernels.ts';
import { GpuAttention } from './attention.ts';
import { readArray, uploadArray, writeArray, type GpuArray } from './buffers.ts';
import { GpuGemm } from './gemm.ts';
import { checkLayout, clearRef, createActs, GpuFlat, type FlatLayout, type GpuActs, type GpuBlockActs, type GptShape } from './gpt-buffers.ts';
import { uploadTokens, type GpuTokens } from './embedding.ts';
import { GpuKernelSet } from './kernel-set.ts';
import { uploadIndices } from './program.ts';

/** AdamW's hyperparameters (src/model/adamw.ts AdamWConfig is one; gradClip 0 disables clipping). */
export type GpuAdamWConfig = Pick<AdamWArgs, 'lr' | 'beta1' | 'beta2' | 'eps' | 'weightDecay'> & { gradClip: number };

export interface GpuGptStepOptions {
  /** sequences per batch (each of the config's context length) */
  batchSize: number;
  optimizer: GpuAdamWConfig;
  /**
   * Test hook: the names of parameters whose gradient the step zeroes before
   * the optimizer (negative controls: a step that drops one layer's gradient).
   */
  dropGradients?: readonly string[];
}

export interface GpuStepResult {
  /** mean cross-entropy over the batch (float64 mean of the float32 per-row losses, as the WASM layer computes it) */
  loss: number;
  /** the gradient norm before clipping */
  gradNorm: number;
}

/** Compiled kernels, parameters, moments and activations of one GPT on one device. */
export class GpuGptStep {
  readonly params: GpuFlat;
  readonly grads: GpuFlat;
  readonly optimizer: GpuAdamWConfig;
  /** AdamW steps taken */
  step = 0;
  private readonly m: GpuArray;
  private readonly v: GpuArray;
  private readonly acts: GpuActs;
  private destroyed = false;

  private constructor(
    private readonly device: GPUDevice,
    readonly config: GptShape,
    readonly layout: FlatLayout,
    private readonly options: GpuGptStepOptions,
    private readonly k: GpuKernelSet,
    private readonly gemm: GpuGemm,
    private readonly attention: GpuAttention,
    params: Float32Array,
  ) {
    if (params.length !== this.layout.size) throw new RangeError(`gpt step: ${params.length} parameters given, the layout holds ${this.layout.size}`);
    const n = this.layout.size;
    this.params = new GpuFlat(this.layout, uploadArray(device, params, 'params'));
    this.grads = new GpuFlat(this.layout, uploadArray(device, new Float32Array(n), 'grads'));
    this.m = uploadArray(device, new Float32Array(n), 'adamw m');
    this.v = uploadArray(device, new Float32Array(n), 'adamw v');
    this.optimizer = { ...options.optimizer };
    this.acts = createActs(device, config, options.batchSize, n, NORM_CHUNK);
  }

  /**
   * Compiles the kernels and uploads the parameters once. `layout` is the
   * model's own layout of the whole model (a whole-model GptStage's
   * `layout`, src/model/params.ts); `params` is laid out by it.
   */
  static async create(device: GPUDevice, config: GptShape, layout: FlatLayout, params: Float32Array, options: GpuGptStepOptions): Promise<GpuGptStep> {
    checkLayout(layout, config);
    if (config.channels % config.heads !== 0) throw new RangeError(`gpt step: ${config.heads} heads do not divide ${config.channels} channels`);
    if (!Number.isInteger(options.batchSize) || options.batchSize < 1) throw new RangeError(`gpt step: batch size ${options.batchSize}`);
    const [k, gemm, attention] = await Promise.all([GpuKernelSet.create(device), GpuGemm.create(device), GpuAttention.create(device, config.channels / config.heads)]);
    return new GpuGptStep(device, config, layout, options, k, gemm, attention, params);
  }

  /**
   * One training step on B sequences (B ≤ batchSize) of the context length:
   * inputs and targets hold B·T ids. `lr` overrides the optimizer's rate for
   * this step. Resolves after the losses and gradient norm are read back;
   * AdamW is queued, not awaited (later reads see it).
   */
  async trainStep(inputs: Int32Array, targets: Int32Array, B: number, lr: number = this.optimizer.lr): Promise<GpuStepResult> {
    this.checkAlive();
    const { contextLength: T, vocabSize: V } = this.config;
    if (!Number.isInteger(B) || B < 1 || B > this.options.batchSize) throw new RangeError(`gpt step: batch ${B} outside 1..${this.options.batchSize}`);
    const N = B * T;
    if (inputs.length !== N || targets.length !== N) throw new RangeError(`gpt step: ${inputs.length} inputs and ${targets.length} targets for ${B}×${T}`);
    const tokens = uploadTokens(this.device, inputs, V);
    const tgt = uploadIndices(this.device, targets, V, 'targets');
    try {
      clearRef(this.device, this.grads.array, this.layout.size);
      this.forward(tokens, tgt, B);
      this.backward(tokens, tgt, B);
      for (const name of this.options.dropGradients ?? []) clearRef(this.device, this.grads.ref(name), this.layout.byName.get(name)!.size);
      const chunks = Math.ceil(this.layout.size / NORM_CHUNK);
      this.k.optimizer.sumSquaresPartials(this.acts.partials, this.grads.array, this.layout.size);
      const [losses, partials] = await Promise.all([readArray(this.device, this.acts.losses, 0, N), readArray(this.device, this.acts.partials, 0, chunks)]);
      let lossSum = 0;
      for (let i = 0; i < N; i++) lossSum += losses[i];
      let sumSq = 0;
      for (let c = 0; c < chunks; c++) sumSq += partials[c];
      const gradNorm = Math.sqrt(sumSq);
      this.update(lr, gradNorm);
      return { loss: lossSum / N, gradNorm };
    } finally {
      tokens.destroy();
      tgt.destroy();
    }
  }

  /** The parameters, read back (waits for queued work). */
  readParams(): Promise<Float32Array> {
    return readArray(this.device, this.params.array);
  }

  /** The gradients of the last step, read back (tests). */
  readGrads(): Promise<Float32Array> {
    return readArray(this.device, this.grads.array);
  }

  /** Replaces the parameters (same layout); the moments and step count stay. */
  writeParams(params: Float32Array): void {
    writeArray(this.device, this.params.array, params);
  }

  destroy(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    for (const a of [...this.acts.all, this.params.array, this.grads.array, this.m, this.v]) a.destroy();
    this.k.destroy();
    this.gemm.destroy();
    this.attention.destroy();
  }

  private checkAlive(): void {
    if (this.destroyed) throw new Error('gpt step was destroyed');
  }

  /** out[N×OC] = inp[N×C] · W[C×OC] (+ b): linearForward of src/model/layers.ts */
  private linearForward(out: GpuArray, inp: GpuArray, w: string, b: string | null, N: number, C: number, OC: number): void {
    const P = this.params;
    this.gemm.sgemm({
      M: N, N: OC, K: C, a: inp, lda: C, b: P.array, bOffset: P.offset(w), ldb: OC, c: out, ldc: OC,
      ...(b ? { bias: P.array, biasOffset: P.offset(b) } : {}),
    });
  }

  /** dinp = dout · Wᵀ (written); dW += inpᵀ · dout; db += column sums: linearBackward of src/model/layers.ts */
  private linearBackward(dinp: GpuArray, w: string, b: string | null, dout: GpuArray, inp: GpuArray, N: number, C: number, OC: number): void {
    const P = this.params, G = this.grads;
    this.gemm.sgemm({ M: N, N: C, K: OC, a: dout, lda: OC, b: P.array, bOffset: P.offset(w), ldb: OC, transB: true, c: dinp, ldc: C });
    this.gemm.sgemm({ M: C, N: OC, K: N, a: inp, lda: C, transA: true, b: dout, ldb: OC, c: G.array, cOffset: G.offset(w), ldc: OC, accumulate: true });
    if (b) this.k.rows.biasBackward(G.ref(b), dout, N, OC);
  }

  /** dinp += ; dw, db += : layernormBackward of src/model/layers.ts */
  private layernormBackward(dinp: GpuArray, w: string, b: string, dout: GpuArray, inp: GpuArray, mean: GpuArray, rstd: GpuArray, N: number): void {
    const C = this.config.channels;
    this.k.rows.layernormBackwardInput(dinp, dout, inp, this.params.ref(w), mean, rstd, N, C);
    this.k.rows.layernormBackwardParams(this.grads.ref(w), this.grads.ref(b), dout, inp, mean, rstd, N, C);
  }

  private forward(tokens: GpuTokens, targets: GpuArray, B: number): void {
    const { contextLength: T, channels: C, vocabSize: V } = this.config;
    const N = B * T, a = this.acts, P = this.params;
    this.k.embedding.embeddingForward(a.inputAct, tokens, P.ref('wte'), P.ref('wpe'), B, T, C);
    a.blocks.forEach((blk, l) => this.blockForward(l, blk, B));
    const x = a.blocks.length ? a.blocks[a.blocks.length - 1].out : a.inputAct;
    this.k.rows.layernormForward(a.lnf, a.lnfMean, a.lnfRstd, x, P.ref('lnf.w'), P.ref('lnf.b'), N, C);
    this.linearForward(a.logits, a.lnf, 'lm_head.w', null, N, C, V);
    this.k.rows.crossEntropyForward(a.losses, a.probs, a.logits, targets, N, V);
  }

  private blockForward(l: number, a: GpuBlockActs, B: number): void {
    const { contextLength: T, channels: C, heads: NH } = this.config;
    const H = C * this.config.mlpRatio, N = B * T, P = this.params, p = `h.${l}.`, tmp = this.acts.tmp;
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

  private backward(tokens: GpuTokens, targets: GpuArray, B: number): void {
    const { contextLength: T, channels: C, vocabSize: V } = this.config;
    const N = B * T, a = this.acts;
    this.k.rows.crossEntropyBackward(a.dlogits, a.probs, targets, 1 / N, N, V);
    this.linearBackward(a.dsmall, 'lm_head.w', null, a.dlogits, a.lnf, N, C, V);
    clearRef(this.device, a.dres, N * C);
    const x = a.blocks.length ? a.blocks[a.blocks.length - 1].out : a.inputAct;
    this.layernormBackward(a.dres, 'lnf.w', 'lnf.b', a.dsmall, x, a.lnfMean, a.lnfRstd, N);
    for (let l = a.blocks.length - 1; l >= 0; l--) this.blockBackward(l, a.blocks[l], B);
    this.k.embedding.embeddingBackward(this.grads.ref('wte'), this.grads.ref('wpe'), a.dres, tokens, B, T, C);
  }

  /** dres holds d(out); on return it holds d(input). */
  private blockBackward(l: number, a: GpuBlockActs, B: number): void {
    const { contextLength: T, channels: C, heads: NH } = this.config;
    const H = C * this.config.mlpRatio, N = B * T, p = `h.${l}.`;
    const { dres, dsmall, dqkv, dbig, dbig2 } = this.acts;
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

  /** AdamW.update of src/model/adamw.ts: clip by the global norm, then the decay range and the rest. */
  private update(lr: number, gradNorm: number): void {
    const c = this.optimizer;
    const scale = c.gradClip > 0 && gradNorm > c.gradClip ? c.gradClip / gradNorm : 1;
    this.step++;
    const ranges: [number, number, number][] = [
      [0, this.layout.decaySize, c.weightDecay],
      [this.layout.decaySize, this.layout.size, 0],
    ];
    for (const [start, end, wd] of ranges) {
      if (end <= start) continue;
      this.k.optimizer.adamw({
        params: { array: this.params.array, offset: start },
        grads: { array: this.grads.array, offset: start },
        m: { array: this.m, offset: start },
        v: { array: this.v, offset: start },
        n: end - start,
        lr, beta1: c.beta1, beta2: c.beta2, eps: c.eps, weightDecay: wd,
        step: this.step,
        gradScale: scale,
      });
    }
  }
}
