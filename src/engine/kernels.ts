// Typed calls into the WASM kernels (assembly/). The one place that knows each
// kernel's argument list; layers call these with tensor pointers (byte
// offsets into the engine's shared memory). Every call runs on all threads.
import type { Heap } from './heap.ts';
import type { ThreadPool } from './pool.ts';

/** Every threaded kernel export, in a fixed order (their op numbers). */
export const KERNEL_NAMES = [
  'sgemm',
  'addForward',
  'accumulate',
  'geluForward',
  'geluBackward',
  'reluForward',
  'reluBackward',
  'adamw',
  'sumSquares',
  'embeddingForward',
  'embeddingBackward',
  'layernormForward',
  'layernormBackwardInput',
  'layernormBackwardParams',
  'biasBackward',
  'crossEntropyForward',
  'crossEntropyBackward',
  'attentionForward',
  'attentionBackward',
  'adamPredict',
  'kvCacheStore',
  'attentionCached',
  'rmsnormForward',
  'rmsnormBackwardInput',
  'rmsnormBackwardParams',
  'ropeForward',
  'ropeBackward',
  'swigluForward',
  'swigluBackward',
  'gqaAttentionForward',
  'gqaAttentionBackward',
  'gqaCacheStore',
  'gqaAttentionCached',
] as const;
type KernelName = (typeof KERNEL_NAMES)[number];
const OP = Object.fromEntries(KERNEL_NAMES.map((n, i) => [n, i])) as Record<KernelName, number>;

/**
 * Scratch sizes the kernel module itself exports (assembly/index.ts), read
 * from the compiled module by the engine (src/engine/engine.ts) so that they
 * are never copied here.
 */
export interface KernelSizes {
  /** Bytes of sgemm scratch one thread needs (SGEMM_WORK_BYTES in assembly/gemm.ts). */
  sgemmWorkBytes: number;
  /** Floats of attention scratch one thread needs for T tokens of head size hs (attentionScratchFloats in assembly/attention.ts). */
  attentionScratchFloats(T: number, hs: number): number;
}

/** Floats of sumSquares chunk: fixes the summation order of norms. The kernel takes it as an argument. */
export const NORM_CHUNK = 16384;

export interface SgemmArgs {
  M: number;
  N: number;
  K: number;
  a: number;
  lda: number;
  transA?: boolean;
  b: number;
  ldb: number;
  transB?: boolean;
  c: number;
  ldc: number;
  accumulate?: boolean;
  bias?: number;
}

export interface AdamWArgs {
  params: number;
  grads: number;
  m: number;
  v: number;
  n: number;
  lr: number;
  beta1: number;
  beta2: number;
  eps: number;
  weightDecay: number;
  /** optimizer step, from 1 */
  step: number;
  /** multiplies each gradient first (clipping) */
  gradScale: number;
}

export class Kernels {
  private readonly sgemmWork: number;
  private scratch = 0;
  private scratchBytes = 0;

  constructor(
    private readonly pool: ThreadPool,
    private readonly heap: Heap,
    readonly threads: number,
    readonly sizes: KernelSizes,
  ) {
    this.sgemmWork = heap.alloc(sizes.sgemmWorkBytes * threads);
  }

  /**
   * Runs `fn` with every kernel call on the calling thread alone. For small
   * work (a decode step of a few rows: sgemm splits rows in blocks of 4, so
   * the other threads would have no matrix work) waking the workers costs
   * more than their share saves. Results are the same bits: no kernel's sums
   * depend on the thread count.
   */
  serial<T>(fn: () => T): T {
    const before = this.pool.defaultThreads;
    this.pool.defaultThreads = 1;
    try {
      return fn();
    } finally {
      this.pool.defaultThreads = before;
    }
  }

  /**
   * C[M×N] = op(A)·op(B) (+ bias[N]) or, with accumulate, C += op(A)·op(B).
   * op(A) is A (M×K, row stride lda) or, with transA, Aᵀ where A is K×M.
   * op(B) is B (K×N, row stride ldb) or, with transB, Bᵀ where B is N×K.
   */
  sgemm(p: SgemmArgs): void {
    this.pool.run(OP.sgemm, [
      p.M, p.N, p.K,
      p.a, p.lda, p.transA ? 1 : 0,
      p.b, p.ldb, p.transB ? 1 : 0,
      p.c, p.ldc,
      p.accumulate ? 1 : 0, p.bias ?? 0,
      this.sgemmWork,
    ]);
  }

  /** out = a + b (n floats) */
  add(out: number, a: number, b: number, n: number): void {
    this.pool.run(OP.addForward, [out, a, b, n]);
  }

  /** dst += src (n floats) */
  accumulate(dst: number, src: number, n: number): void {
    this.pool.run(OP.accumulate, [dst, src, n]);
  }

  geluForward(out: number, inp: number, n: number): void {
    this.pool.run(OP.geluForward, [out, inp, n]);
  }

  /** dinp = gelu'(inp) · dout */
  geluBackward(dinp: number, inp: number, dout: number, n: number): void {
    this.pool.run(OP.geluBackward, [dinp, inp, dout, n]);
  }

  reluForward(out: number, inp: number, n: number): void {
    this.pool.run(OP.reluForward, [out, inp, n]);
  }

  /** dinp = inp > 0 ? dout : 0 */
  reluBackward(dinp: number, inp: number, dout: number, n: number): void {
    this.pool.run(OP.reluBackward, [dinp, inp, dout, n]);
  }

  adamw(p: AdamWArgs): void {
    const bc1 = 1 - Math.pow(p.beta1, p.step);
    const bc2 = 1 - Math.pow(p.beta2, p.step);
    this.pool.run(OP.adamw, [
      p.params, p.grads, p.m, p.v, p.n,
      p.lr, p.beta1, p.beta2, p.eps, p.weightDecay, bc1, bc2, p.gradScale,
    ]);
  }

  /** out = params − k · (m / bc1) / (√(v / bc2) + eps) (n floats; out may be params) */
  adamPredict(out: number, params: number, m: number, v: number, n: number, k: number, bc1: number, bc2: number, eps: number): void {
    this.pool.run(OP.adamPredict, [out, params, m, v, n, k, bc1, bc2, eps]);
  }

  /** Sum of squares of n floats, summed in a fixed order (any thread count). */
  sumSquares(x: number, n: number): number {
    const chunks = Math.ceil(n / NORM_CHUNK);
    const partials = this.ensureScratch(chunks * 8);
    this.pool.run(OP.sumSquares, [partials, x, n, NORM_CHUNK]);
    const view = new Float64Array(this.heapBuffer(), partials, chunks);
    let total = 0;
    for (let i = 0; i < chunks; i++) total += view[i];
    return total;
  }

  embeddingForward(out: number, tokens: number, wte: number, wpe: number, B: number, T: number, C: number): void {
    this.pool.run(OP.embeddingForward, [out, tokens, wte, wpe, B, T, C]);
  }

  /** dwte, dwpe += from dout */
  embeddingBackward(dwte: number, dwpe: number, dout: number, tokens: number, B: number, T: number, C: number): void {
    this.pool.run(OP.embeddingBackward, [dwte, dwpe, dout, tokens, B, T, C]);
  }

  /** rstd = 1 / √(var + eps); eps defaults to GPT-2's 1e-5 (layer_norm_epsilon) */
  layernormForward(out: number, mean: number, rstd: number, inp: number, w: number, b: number, N: number, C: number, eps = 1e-5): void {
    this.pool.run(OP.layernormForward, [out, mean, rstd, inp, w, b, N, C, eps]);
  }

  /** dinp += input gradient of layer norm */
  layernormBackwardInput(dinp: number, dout: number, inp: number, w: number, mean: number, rstd: number, N: number, C: number): void {
    this.pool.run(OP.layernormBackwardInput, [dinp, dout, inp, w, mean, rstd, N, C]);
  }

  /** dw, db += parameter gradients of layer norm */
  layernormBackwardParams(dw: number, db: number, dout: number, inp: number, mean: number, rstd: number, N: number, C: number): void {
    this.pool.run(OP.layernormBackwardParams, [dw, db, dout, inp, mean, rstd, N, C]);
  }

  /** dbias += column sums of dout (N×C) */
  biasBackward(dbias: number, dout: number, N: number, C: number): void {
    this.pool.run(OP.biasBackward, [dbias, dout, N, C]);
  }

  crossEntropyForward(losses: number, probs: number, logits: number, targets: number, N: number, V: number): void {
    this.pool.run(OP.crossEntropyForward, [losses, probs, logits, targets, N, V]);
  }

  /** dlogits = (probs − onehot(targets)) · scale */
  crossEntropyBackward(dlogits: number, probs: number, targets: number, scale: number, N: number, V: number): void {
    this.pool.run(OP.crossEntropyBackward, [dlogits, probs, targets, scale, N, V]);
  }

  attentionForward(out: number, att: number, qkv: number, B: number, T: number, C: number, NH: number): void {
    const scratch = this.ensureScratch(this.attentionScratchBytes(T, C / NH));
    this.pool.run(OP.attentionForward, [out, att, qkv, B, T, C, NH, scratch]);
  }

  /** dqkv = gradient of attention (written, not accumulated) */
  attentionBackward(dqkv: number, dout: number, qkv: number, att: number, B: number, T: number, C: number, NH: number): void {
    const scratch = this.ensureScratch(this.attentionScratchBytes(T, C / NH));
    this.pool.run(OP.attentionBackward, [dqkv, dout, qkv, att, B, T, C, NH, scratch]);
  }

  /**
   * Writes the keys and values of `rows` rows of qkv (rows × 3C) into their
   * sessions' KV caches (assembly/attention-cached.ts): `table` holds, per
   * row, the session's cache base (byte offset) and the row's position;
   * the layer's keys start `kOffset` bytes into the cache, its values `vOffset`.
   */
  kvCacheStore(qkv: number, table: number, rows: number, kOffset: number, vOffset: number, C: number, T: number): void {
    this.pool.run(OP.kvCacheStore, [qkv, table, rows, kOffset, vOffset, C, T]);
  }

  /** out (rows × C) = each row's causal attention over its session's cached keys and values at positions 0..pos (same table as kvCacheStore). */
  attentionCached(out: number, qkv: number, table: number, rows: number, kOffset: number, vOffset: number, C: number, NH: number, T: number): void {
    const scratch = this.ensureScratch(this.attentionScratchBytes(T, C / NH));
    this.pool.run(OP.attentionCached, [out, qkv, table, rows, kOffset, vOffset, C, NH, T, scratch]);
  }

  // ---- Llama-family decoders (assembly/decoder.ts, assembly/attention-gqa.ts) ----

  /** out = inp · rstd · w per row (N×C), rstd = 1 / √(mean(inp²) + eps), saved (N floats) */
  rmsnormForward(out: number, rstd: number, inp: number, w: number, eps: number, N: number, C: number): void {
    this.pool.run(OP.rmsnormForward, [out, rstd, inp, w, eps, N, C]);
  }

  /** dinp += input gradient of RMSNorm */
  rmsnormBackwardInput(dinp: number, dout: number, inp: number, w: number, rstd: number, N: number, C: number): void {
    this.pool.run(OP.rmsnormBackwardInput, [dinp, dout, inp, w, rstd, N, C]);
  }

  /** dw += weight gradient of RMSNorm */
  rmsnormBackwardParams(dw: number, dout: number, inp: number, rstd: number, N: number, C: number): void {
    this.pool.run(OP.rmsnormBackwardParams, [dw, dout, inp, rstd, N, C]);
  }

  /**
   * Rotary embeddings on the first `heads` heads (headDim floats each, even)
   * of `rows` rows `stride` floats apart: row r turns by the position held in
   * the int32 at positions + 4·r·posStride, with cos/sin from `table`
   * (positions × headDim floats: per position, cos of the headDim/2 angles,
   * then their sin; src/model/rope.ts). out may be inp.
   */
  ropeForward(out: number, inp: number, rows: number, heads: number, headDim: number, stride: number, positions: number, posStride: number, table: number): void {
    checkEven(headDim);
    this.pool.run(OP.ropeForward, [out, inp, rows, heads, headDim, stride, positions, posStride, table]);
  }

  /** dinp = the inverse rotation of dout (written; dinp may be dout); arguments as ropeForward */
  ropeBackward(dinp: number, dout: number, rows: number, heads: number, headDim: number, stride: number, positions: number, posStride: number, table: number): void {
    checkEven(headDim);
    this.pool.run(OP.ropeBackward, [dinp, dout, rows, heads, headDim, stride, positions, posStride, table]);
  }

  /** out (N×I) = silu(gate) · up, from inp (N×2I: [gate | up] per row) */
  swigluForward(out: number, inp: number, N: number, I: number): void {
    this.pool.run(OP.swigluForward, [out, inp, N, I]);
  }

  /** dinp (N×2I) = gradient of swigluForward (written) */
  swigluBackward(dinp: number, inp: number, dout: number, N: number, I: number): void {
    this.pool.run(OP.swigluBackward, [dinp, inp, dout, N, I]);
  }

  /**
   * Grouped-query causal attention: out (B·T × H·D) from qkv (B·T × (H + 2KV)·D:
   * q heads, k heads, v heads); att (B × H × T × T) keeps the probabilities.
   */
  gqaAttentionForward(out: number, att: number, qkv: number, B: number, T: number, H: number, KV: number, D: number): void {
    checkHeads(H, KV, D);
    const scratch = this.ensureScratch(this.attentionScratchBytes(T, D));
    this.pool.run(OP.gqaAttentionForward, [out, att, qkv, B, T, H, KV, D, scratch]);
  }

  /** dqkv = gradient of gqaAttentionForward (q, k and v parts written, not accumulated) */
  gqaAttentionBackward(dqkv: number, dout: number, qkv: number, att: number, B: number, T: number, H: number, KV: number, D: number): void {
    checkHeads(H, KV, D);
    const scratch = this.ensureScratch(this.attentionScratchBytes(T, D));
    this.pool.run(OP.gqaAttentionBackward, [dqkv, dout, qkv, att, B, T, H, KV, D, scratch]);
  }

  /**
   * Writes the keys and values of `rows` qkv rows into their sessions' caches
   * of KV·D channels (assembly/attention-gqa.ts; the row table as kvCacheStore's).
   */
  gqaCacheStore(qkv: number, table: number, rows: number, kOffset: number, vOffset: number, H: number, KV: number, D: number, T: number): void {
    checkHeads(H, KV, D);
    this.pool.run(OP.gqaCacheStore, [qkv, table, rows, kOffset, vOffset, H, KV, D, T]);
  }

  /** out (rows × H·D) = each row's grouped-query attention over its session's cache at positions 0..pos */
  gqaAttentionCached(out: number, qkv: number, table: number, rows: number, kOffset: number, vOffset: number, H: number, KV: number, D: number, T: number): void {
    checkHeads(H, KV, D);
    const scratch = this.ensureScratch(this.attentionScratchBytes(T, D));
    this.pool.run(OP.gqaAttentionCached, [out, qkv, table, rows, kOffset, vOffset, H, KV, D, T, scratch]);
  }

  /** Bytes of attention scratch for every thread. */
  private attentionScratchBytes(T: number, hs: number): number {
    return this.sizes.attentionScratchFloats(T, hs) * 4 * this.threads;
  }

  private heapBuffer(): ArrayBufferLike {
    return this.heap.buffer();
  }

  /** Scratch shared by kernels that need it; grown on demand, never on the hot path after warm-up. */
  private ensureScratch(bytes: number): number {
    if (bytes > this.scratchBytes) {
      if (this.scratch) this.heap.release(this.scratch);
      this.scratchBytes = Math.max(bytes, this.scratchBytes * 2);
      this.scratch = this.heap.alloc(this.scratchBytes);
    }
    return this.scratch;
  }
}

function checkEven(headDim: number): void {
  if (!(Number.isInteger(headDim) && headDim > 0 && headDim % 2 === 0)) throw new RangeError(`rope: headDim ${headDim} must be a positive even integer`);
}

/** The attention kernels' shape rules: heads a multiple of kvHeads, headDim a multiple of 4 (whole vectors). */
function checkHeads(H: number, KV: number, D: number): void {
  if (!(Number.isInteger(H) && Number.isInteger(KV) && KV > 0 && H > 0 && H % KV === 0)) throw new RangeError(`attention: heads ${H} must be a positive multiple of kvHeads ${KV}`);
  if (!(Number.isInteger(D) && D > 0 && D % 4 === 0)) throw new RangeError(`attention: headDim ${D} must be a positive multiple of 4`);
}
