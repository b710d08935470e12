// A linear with LoRA adapters, forward and backward side by side (llm.c
// style, the shapes of ./layers.ts: N rows, IN inputs, OUT outputs, the base
// weight W stored [IN, OUT]). Each adapter adds to its column block
// [col, col + w) of the output:
//
//   forward   xd = dropout(x)                 N × IN (x itself without dropout)
//             v  = s · xd Aᵀ                  N × r    (kept for backward)
//             y[:, col…] += v Bᵀ              N × w
//   backward  dB += dy[:, col…]ᵀ v            w × r
//             du  = s · dy[:, col…] B         N × r
//             dA += duᵀ xd                    r × IN
//             dx += (du A) ⊙ mask             N × IN
//
// with s = alpha / r. The base W (and its bias) is frozen: its backward gives
// dx = dy Wᵀ and no gradient. Dropout is PEFT's (one mask per adapted module,
// kept with probability 1 − p and scaled by 1 / (1 − p)); its mask is drawn
// from (seed, module name), so the backward draws the same mask again rather
// than keep it, and a recomputation with the seed gets the same forward.
import type { Kernels } from '../engine/kernels.ts';
import type { Tensor } from '../engine/tensor.ts';
import { hashSeed, mulberry32 } from './init.ts';
import * as L from './layers.ts';
import type { LinearName, LoraSite } from './lora.ts';

/** One adapter of a block in a stage: its matrices (views of the stage's flat buffers) and what its forward keeps. */
export interface LoraAdapter {
  site: LoraSite;
  /** the engine name's prefix (h.l.lora.module): the dropout mask's stream */
  name: string;
  A: Tensor;
  B: Tensor;
  dA: Tensor;
  dB: Tensor;
  /** s · dropout(x) Aᵀ of the last forward (N × r): one per microbatch slot */
  v: Tensor;
}

/** Scratch the adapters of a stage share (N rows, the widest adapted input). */
export interface LoraScratch {
  /** N × r */
  du: Tensor;
  /** N × maxIn: dropout(x), then du A */
  xd: Tensor;
  dxd: Tensor;
  /** the dropout mask of one adapter (N × maxIn; 0 or 1 / (1 − p)) */
  mask: Float32Array;
}

/** A block's adapters in one microbatch slot, by the linear they add to. */
export interface BlockLora {
  scale: number;
  rank: number;
  /** dropout probability, applied when `training` */
  dropout: number;
  training: boolean;
  /** the seed of this microbatch's dropout masks (set by the stage before each forward) */
  maskSeed: number;
  adapters: ReadonlyMap<LinearName, readonly LoraAdapter[]>;
  scratch: LoraScratch;
}

const dropoutOn = (lora: BlockLora): boolean => lora.training && lora.dropout > 0;

/** mask[i] = 1 / (1 − p) with probability 1 − p, else 0: drawn from (seed, name), the same each time. */
export function dropoutMask(mask: Float32Array, n: number, seed: number, name: string, p: number): void {
  const uniform = mulberry32(hashSeed(seed, name));
  const keep = 1 / (1 - p);
  for (let i = 0; i < n; i++) mask[i] = uniform() < p ? 0 : keep;
}

/** The adapter's input: x, or x ⊙ its dropout mask in scratch (the mask left in scratch.mask). */
function adapterInput(lora: BlockLora, ad: LoraAdapter, x: Tensor, N: number, IN: number): Tensor {
  if (!dropoutOn(lora)) return x;
  const { mask, xd } = lora.scratch;
  const n = N * IN;
  dropoutMask(mask, n, lora.maskSeed, ad.name, lora.dropout);
  const src = x.data, dst = xd.data;
  for (let i = 0; i < n; i++) dst[i] = src[i] * mask[i];
  return xd;
}

function scaleInPlace(t: Tensor, n: number, s: number): void {
  const d = t.data;
  for (let i = 0; i < n; i++) d[i] *= s;
}

/** out = inp · W + b, plus the adapters of `linear` (none when lora is null). */
export function loraLinearForward(
  k: Kernels, out: Tensor, inp: Tensor, w: Tensor, b: Tensor | null, N: number, IN: number, OUT: number, lora: BlockLora | null, linear: LinearName,
): void {
  L.linearForward(k, out, inp, w, b, N, IN, OUT);
  const adapters = lora?.adapters.get(linear);
  if (!lora || !adapters) return;
  const r = lora.rank;
  for (const ad of adapters) {
    const x = adapterInput(lora, ad, inp, N, IN);
    k.sgemm({ M: N, N: r, K: IN, a: x.ptr, lda: IN, b: ad.A.ptr, ldb: IN, transB: true, c: ad.v.ptr, ldc: r });
    scaleInPlace(ad.v, N * r, lora.scale);
    k.sgemm({ M: N, N: ad.site.width, K: r, a: ad.v.ptr, lda: r, b: ad.B.ptr, ldb: r, transB: true, c: out.ptr + ad.site.col * 4, ldc: OUT, accumulate: true });
  }
}

/** dinp = dout · Wᵀ (written, or added with accumulateInput): a frozen linear's backward, no gradient for W or b. */
export function frozenLinearBackward(k: Kernels, dinp: Tensor, dout: Tensor, w: Tensor, N: number, IN: number, OUT: number, accumulateInput = false): void {
  k.sgemm({ M: N, N: IN, K: OUT, a: dout.ptr, lda: OUT, b: w.ptr, ldb: OUT, transB: true, c: dinp.ptr, ldc: IN, accumulate: accumulateInput });
}

/**
 * Backward of loraLinearForward. dinp = dout · Wᵀ (written) plus every
 * adapter's input gradient; W's gradient += when dw is given (full
 * training), none when it is null (frozen: LoRA); the adapters' dA, dB +=.
 */
export function loraLinearBackward(
  k: Kernels, dinp: Tensor, dw: Tensor | null, db: Tensor | null, dout: Tensor, inp: Tensor, w: Tensor, N: number, IN: number, OUT: number,
  lora: BlockLora | null, linear: LinearName,
): void {
  if (dw) L.linearBackward(k, dinp, dw, db, dout, inp, w, N, IN, OUT);
  else frozenLinearBackward(k, dinp, dout, w, N, IN, OUT);
  const adapters = lora?.adapters.get(linear);
  if (!lora || !adapters) return;
  const r = lora.rank;
  const { du, dxd, mask } = lora.scratch;
  for (const ad of adapters) {
    const { col, width } = ad.site;
    const dy = dout.ptr + col * 4;
    k.sgemm({ M: width, N: r, K: N, a: dy, lda: OUT, transA: true, b: ad.v.ptr, ldb: r, c: ad.dB.ptr, ldc: r, accumulate: true });
    k.sgemm({ M: N, N: r, K: width, a: dy, lda: OUT, b: ad.B.ptr, ldb: r, c: du.ptr, ldc: r });
    scaleInPlace(du, N * r, lora.scale);
    const x = adapterInput(lora, ad, inp, N, IN);
    k.sgemm({ M: r, N: IN, K: N, a: du.ptr, lda: r, transA: true, b: x.ptr, ldb: IN, c: ad.dA.ptr, ldc: IN, accumulate: true });
    if (!dropoutOn(lora)) {
      k.sgemm({ M: N, N: IN, K: r, a: du.ptr, lda: r, b: ad.A.ptr, ldb: IN, c: dinp.ptr, ldc: IN, accumulate: true });
      continue;
    }
    k.sgemm({ M: N, N: IN, K: r, a: du.ptr, lda: r, b: ad.A.ptr, ldb: IN, c: dxd.ptr, ldc: IN });
    const d = dinp.data, g = dxd.data, n = N * IN;
    for (let i = 0; i < n; i++) d[i] += g[i] * mask[i];
  }
}
