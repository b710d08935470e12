// Causal self-attention on the GPU: the WebGPU counterpart of
// Kernels.attentionForward / attentionBackward and of the grouped-query
// Kernels.gqaAttentionForward / gqaAttentionBackward (src/engine/kernels.ts),
// with the same qkv, out and dqkv layouts and GPU arrays in place of heap
// pointers. A call takes either shape: an AttentionShape (B, T, C, NH: the
// GPT's q | k | v) or a GqaShape (B, T, H, KV, D: Llama's fused qkv of
// (H + 2·KV)·D per row); the first is the second with H = KV = NH, D = C/NH.
// One difference in saved state: the WASM forward saves the whole attention
// matrix att (B×NH×T×T) for its backward; this forward is fused
// (FlashAttention-style, see attention.wgsl.ts) and saves only each row's
// softmax max and sum (`stats`, B×NH×T×2), from which the backward recomputes
// the probabilities. `probs` writes the WASM att from the stats when a caller
// needs it.
import { createArray, type GpuArray } from './buffers.ts';
import { recorderOf } from './recorder.ts';
import { ATTENTION_PARAMS_BYTES, ATTENTION_PROBS_THREADS, ATTENTION_ROWS, attentionWgsl, type AttentionShaders } from './attention.wgsl.ts';

/** Sizes: batch, sequence length, channels (3C per qkv row), heads. */
export interface AttentionShape {
  B: number;
  T: number;
  C: number;
  NH: number;
}

/** Grouped-query sizes: batch, sequence length, query heads H, key/value heads KV (dividing H), head size D. */
export interface GqaShape {
  B: number;
  T: number;
  H: number;
  KV: number;
  D: number;
}

export type AnyAttentionShape = AttentionShape | GqaShape;

/** The grouped-query form of either shape (multi-head: H = KV = NH, D = C/NH). */
export function gqaShapeOf(s: AnyAttentionShape): GqaShape {
  return 'NH' in s ? { B: s.B, T: s.T, H: s.NH, KV: s.NH, D: s.C / s.NH } : s;
}

/** Floats per qkv row, (H + 2·KV)·D, and per out row, H·D. */
export function attentionWidths(s: AnyAttentionShape): { qkv: number; out: number } {
  const g = gqaShapeOf(s);
  return { qkv: (g.H + 2 * g.KV) * g.D, out: g.H * g.D };
}

/** out (B×T×H·D) and stats (B×H×T×2) from qkv (B×T×(H + 2KV)·D). */
export type GpuAttentionForwardArgs = AnyAttentionShape & {
  qkv: GpuArray;
  out: GpuArray;
  stats: GpuArray;
};

/** att (B×H×T×T, the WASM forward's saved matrix) from qkv and the stats. */
export type GpuAttentionProbsArgs = AnyAttentionShape & {
  qkv: GpuArray;
  stats: GpuArray;
  att: GpuArray;
};

/** dqkv (B×T×(H + 2KV)·D, written) from dout (B×T×H·D), and qkv, out and stats of the forward. */
export type GpuAttentionBackwardArgs = AnyAttentionShape & {
  dqkv: GpuArray;
  dout: GpuArray;
  qkv: GpuArray;
  out: GpuArray;
  stats: GpuArray;
};

/** Floats of the saved state: a max and a sum per (batch, query head, row). */
export function attentionStatsLength(s: AnyAttentionShape): number {
  const g = gqaShapeOf(s);
  return g.B * g.H * g.T * 2;
}

/** The scale both backends use: 1/√hs rounded as float32 computes it. */
export function attentionScale(hs: number): number {
  return Math.fround(1 / Math.fround(Math.sqrt(hs)));
}

type Kernel = keyof AttentionShaders;
const KERNELS: readonly Kernel[] = ['forward', 'probs', 'rowDot', 'backwardQ', 'backwardKV'];

/** Compiled pipelines by device and WGSL source (SwiftShader takes ~0.3 s per pipeline; Dawn does not reuse them). */
const compiled = new WeakMap<GPUDevice, Map<string, Promise<GPUComputePipeline>>>();

function pipeline(device: GPUDevice, label: string, code: string): Promise<GPUComputePipeline> {
  let cache = compiled.get(device);
  if (!cache) compiled.set(device, (cache = new Map()));
  let made = cache.get(code);
  if (!made) {
    made = device.createComputePipelineAsync({ label, layout: 'auto', compute: { module: device.createShaderModule({ label, code }), entryPoint: 'main' } });
    made.catch(() => cache.delete(code));
    cache.set(code, made);
  }
  return made;
}

/** The attention pipelines for one head size, and the buffers they share. */
export class GpuAttention {
  private rowDot: GpuArray;

  private constructor(
    private readonly device: GPUDevice,
    /** the head size C/NH these pipelines were compiled for */
    readonly hs: number,
    private readonly pipelines: Readonly<Record<Kernel, GPUComputePipeline>>,
  ) {
    this.rowDot = createArray(device, 1, 'attention rowDot');
  }

  /**
   * Compiles the five shaders for head size `hs`; rejects with the compiler's
   * message if one fails. `code` replaces the generated WGSL (tests break it
   * on purpose to show that their bound catches the fault).
   */
  static async create(device: GPUDevice, hs: number, code: AttentionShaders = attentionWgsl(hs)): Promise<GpuAttention> {
    const built = await Promise.all(KERNELS.map((name) => pipeline(device, `attention ${name} hs=${hs}`, code[name])));
    const pipelines = Object.fromEntries(KERNELS.map((name, i) => [name, built[i]])) as Record<Kernel, GPUComputePipeline>;
    return new GpuAttention(device, hs, pipelines);
  }

  /** Records the forward; nothing waits. */
  forward(a: GpuAttentionForwardArgs): void {
    const g = gqaShapeOf(a), w = attentionWidths(a);
    this.check('forward', a, { qkv: a.qkv }, { out: a.out, stats: a.stats }, { out: a.B * a.T * w.out, stats: attentionStatsLength(a) });
    if (a.B === 0) return;
    this.submit('forward', g, [this.step('forward', [a.qkv, a.out, a.stats], Math.ceil(a.T / ATTENTION_ROWS), a.B * g.H)]);
  }

  /** Records the materialisation of att (zero above the diagonal, as the WASM forward writes it). */
  probs(a: GpuAttentionProbsArgs): void {
    const g = gqaShapeOf(a);
    this.check('probs', a, { qkv: a.qkv, stats: a.stats }, { att: a.att }, { stats: attentionStatsLength(a), att: a.B * g.H * a.T * a.T });
    if (a.B === 0) return;
    this.submit('probs', g, [this.step('probs', [a.qkv, a.stats, a.att], Math.ceil((a.T * a.T) / ATTENTION_PROBS_THREADS), a.B * g.H)]);
  }

  /** Records the backward: every float of dqkv's B×T×(H + 2KV)·D is written. */
  backward(a: GpuAttentionBackwardArgs): void {
    const g = gqaShapeOf(a), w = attentionWidths(a);
    const rows = a.B * g.H * a.T;
    this.check('backward', a, { dout: a.dout, qkv: a.qkv, out: a.out, stats: a.stats }, { dqkv: a.dqkv },
      { dqkv: a.B * a.T * w.qkv, dout: a.B * a.T * w.out, out: a.B * a.T * w.out, stats: attentionStatsLength(a) });
    if (a.B === 0) return;
    if (this.rowDot.length < rows) {
      this.rowDot.destroy();
      this.rowDot = createArray(this.device, rows, 'attention rowDot');
    }
    const blocks = Math.ceil(a.T / ATTENTION_ROWS), pairs = a.B * g.H;
    const bindings = [a.qkv, a.dout, a.stats, this.rowDot, a.dqkv];
    this.submit('backward', g, [
      this.step('rowDot', [a.dout, a.out, this.rowDot], blocks, pairs),
      this.step('backwardQ', bindings, blocks, pairs),
      this.step('backwardKV', bindings, blocks, a.B * g.KV),
    ]);
  }

  destroy(): void {
    this.rowDot.destroy();
  }

  /** A dispatch of `kernel` with the params at binding 0 and `arrays` at 1, 2, ... */
  private step(kernel: Kernel, arrays: readonly GpuArray[], x: number, y: number): { kernel: Kernel; buffers: GPUBuffer[]; x: number; y: number } {
    return { kernel, buffers: arrays.map((a) => a.buffer), x, y };
  }

  /** Records the dispatches in order (each sees the ones before), each with the shape's parameter block. */
  private submit(label: string, s: GqaShape, steps: readonly ReturnType<GpuAttention['step']>[]): void {
    const params = new ArrayBuffer(ATTENTION_PARAMS_BYTES);
    new Uint32Array(params, 0, 4).set([s.B, s.T, s.H, s.KV]);
    new Float32Array(params, 16, 1)[0] = attentionScale(this.hs);
    const recorder = recorderOf(this.device);
    for (const st of steps) recorder.dispatch(`attention ${label} ${st.kernel}`, this.pipelines[st.kernel], params, st.buffers, st.x, st.y);
  }

  /**
   * Checks the shape against the compiled head size, every array against the
   * floats it must hold, and that no written array shares a buffer with
   * another binding (WebGPU forbids it). On a GPU an out-of-range read returns
   * some other value of the buffer, so a wrong size would show only as wrong numbers.
   */
  private check(op: string, s: AnyAttentionShape, reads: Record<string, GpuArray>, writes: Record<string, GpuArray>, need: Record<string, number>): void {
    const sizes = 'NH' in s ? { B: s.B, T: s.T, C: s.C, NH: s.NH } : { B: s.B, T: s.T, H: s.H, KV: s.KV, D: s.D };
    for (const [name, v] of Object.entries(sizes)) {
      if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) throw new RangeError(`attention ${op}: ${name} = ${v} is not a u32`);
    }
    if ('NH' in s) {
      if (s.T < 1 || s.NH < 1 || s.C % s.NH !== 0) throw new RangeError(`attention ${op}: T = ${s.T}, C = ${s.C}, NH = ${s.NH} (T ≥ 1, NH ≥ 1 dividing C)`);
      if (s.C / s.NH !== this.hs) throw new RangeError(`attention ${op}: head size C/NH = ${s.C / s.NH}, these pipelines are for ${this.hs}`);
    } else {
      if (s.T < 1 || s.KV < 1 || s.H % s.KV !== 0 || s.H < 1) throw new RangeError(`attention ${op}: T = ${s.T}, H = ${s.H}, KV = ${s.KV} (T ≥ 1, KV ≥ 1 dividing H)`);
      if (s.D !== this.hs) throw new RangeError(`attention ${op}: head size D = ${s.D}, these pipelines are for ${this.hs}`);
    }
    const g = gqaShapeOf(s);
    const all: Record<string, GpuArray> = { ...reads, ...writes };
    const needed: Record<string, number> = { qkv: s.B * s.T * attentionWidths(s).qkv, ...need };
    for (const [name, arr] of Object.entries(all)) {
      const n = needed[name];
      if (n !== undefined && arr.length < n) throw new RangeError(`attention ${op}: ${name} needs ${n} floats, its array holds ${arr.length}`);
    }
    for (const [w, arr] of Object.entries(writes)) {
      for (const [other, o] of Object.entries(all)) {
        if (other !== w && o.buffer === arr.buffer) throw new RangeError(`attention ${op}: ${w} shares its buffer with ${other}`);
      }
    }
    const max = this.device.limits.maxComputeWorkgroupsPerDimension;
    const x = Math.max(Math.ceil(s.T / ATTENTION_ROWS), op === 'probs' ? Math.ceil((s.T * s.T) / ATTENTION_PROBS_THREADS) : 0);
    if (s.B * g.H > max || x > max) throw new RangeError(`attention ${op}: ${s.B * g.H}×${x} workgroups, the device allows ${max} along one side`);
  }
}
