// The layers, each a forward / backward pair over tensors in the engine's
// memory (llm.c style). Shapes: N = B·T rows, C channels. Linear weights are
// stored [in, out] so the forward pass is x · W. Backward passes accumulate
// (+=) into parameter gradients; what they do to input gradients is stated on
// each function.
import type { Kernels } from '../engine/kernels.ts';
import type { Tensor } from '../engine/tensor.ts';

/** Token ids and targets live in the engine memory as int32. */
export interface IntBuffer {
  ptr: number;
  data: Int32Array;
}

// ---- token + position embedding ------------------------------------------

export function embeddingForward(k: Kernels, out: Tensor, tokens: IntBuffer, wte: Tensor, wpe: Tensor, B: number, T: number, C: number): void {
  k.embeddingForward(out.ptr, tokens.ptr, wte.ptr, wpe.ptr, B, T, C);
}

/** dwte, dwpe += */
export function embeddingBackward(k: Kernels, dwte: Tensor, dwpe: Tensor, dout: Tensor, tokens: IntBuffer, B: number, T: number, C: number): void {
  k.embeddingBackward(dwte.ptr, dwpe.ptr, dout.ptr, tokens.ptr, B, T, C);
}

// ---- layer norm -----------------------------------------------------------

/** out = (inp − mean) · rstd · w + b per row, rstd = 1 / √(var + eps) (eps: the config's normEps; GPT-2's 1e-5 by default) */
export function layernormForward(k: Kernels, out: Tensor, mean: Tensor, rstd: Tensor, inp: Tensor, w: Tensor, b: Tensor, N: number, C: number, eps = 1e-5): void {
  k.layernormForward(out.ptr, mean.ptr, rstd.ptr, inp.ptr, w.ptr, b.ptr, N, C, eps);
}

/** dinp += ; dw, db += */
export function layernormBackward(
  k: Kernels, dinp: Tensor, dw: Tensor, db: Tensor, dout: Tensor, inp: Tensor, w: Tensor, mean: Tensor, rstd: Tensor, N: number, C: number,
): void {
  k.layernormBackwardInput(dinp.ptr, dout.ptr, inp.ptr, w.ptr, mean.ptr, rstd.ptr, N, C);
  k.layernormBackwardParams(dw.ptr, db.ptr, dout.ptr, inp.ptr, mean.ptr, rstd.ptr, N, C);
}

// ---- linear (with optional bias) -----------------------------------------

/** out[N×OC] = inp[N×C] · w[C×OC] + b */
export function linearForward(k: Kernels, out: Tensor, inp: Tensor, w: Tensor, b: Tensor | null, N: number, C: number, OC: number): void {
  k.sgemm({ M: N, N: OC, K: C, a: inp.ptr, lda: C, b: w.ptr, ldb: OC, c: out.ptr, ldc: OC, bias: b?.ptr });
}

/**
 * dinp = dout · wᵀ (written, or added with accumulateInput); dw += inpᵀ · dout;
 * db += column sums of dout. dinp may be null when the input needs no gradient.
 */
export function linearBackward(
  k: Kernels, dinp: Tensor | null, dw: Tensor, db: Tensor | null, dout: Tensor, inp: Tensor, w: Tensor,
  N: number, C: number, OC: number, accumulateInput = false,
): void {
  if (dinp) {
    k.sgemm({ M: N, N: C, K: OC, a: dout.ptr, lda: OC, b: w.ptr, ldb: OC, transB: true, c: dinp.ptr, ldc: C, accumulate: accumulateInput });
  }
  k.sgemm({ M: C, N: OC, K: N, a: inp.ptr, lda: C, transA: true, b: dout.ptr, ldb: OC, c: dw.ptr, ldc: OC, accumulate: true });
  if (db) k.biasBackward(db.ptr, dout.ptr, N, OC);
}

// ---- causal multi-head self-attention ------------------------------------

/** out[N×C] from qkv[N×3C]; att[B×NH×T×T] keeps the probabilities for backward. */
export function attentionForward(k: Kernels, out: Tensor, att: Tensor, qkv: Tensor, B: number, T: number, C: number, NH: number): void {
  k.attentionForward(out.ptr, att.ptr, qkv.ptr, B, T, C, NH);
}

/** dqkv = (written) */
export function attentionBackward(k: Kernels, dqkv: Tensor, dout: Tensor, qkv: Tensor, att: Tensor, B: number, T: number, C: number, NH: number): void {
  k.attentionBackward(dqkv.ptr, dout.ptr, qkv.ptr, att.ptr, B, T, C, NH);
}

// ---- activations and residual --------------------------------------------

/** GELU, tanh form: 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))) */
export function geluForward(k: Kernels, out: Tensor, inp: Tensor, n: number): void {
  k.geluForward(out.ptr, inp.ptr, n);
}

/** dinp = (written; may alias dout) */
export function geluBackward(k: Kernels, dinp: Tensor, inp: Tensor, dout: Tensor, n: number): void {
  k.geluBackward(dinp.ptr, inp.ptr, dout.ptr, n);
}

export function reluForward(k: Kernels, out: Tensor, inp: Tensor, n: number): void {
  k.reluForward(out.ptr, inp.ptr, n);
}

/** dinp = (written; may alias dout) */
export function reluBackward(k: Kernels, dinp: Tensor, inp: Tensor, dout: Tensor, n: number): void {
  k.reluBackward(dinp.ptr, inp.ptr, dout.ptr, n);
}

/** out = a + b */
export function residualForward(k: Kernels, out: Tensor, a: Tensor, b: Tensor, n: number): void {
  k.add(out.ptr, a.ptr, b.ptr, n);
}

/** da += dout; db += dout (the residual's gradient reaches both branches) */
export function residualBackward(k: Kernels, da: Tensor, db: Tensor, dout: Tensor, n: number): void {
  k.accumulate(da.ptr, dout.ptr, n);
  k.accumulate(db.ptr, dout.ptr, n);
}

// ---- softmax cross-entropy ----------------------------------------------

/** probs = softmax(logits) per row; losses[r] = −log probs[r, targets[r]]. Returns the mean loss. */
export function crossEntropyForward(k: Kernels, losses: Tensor, probs: Tensor, logits: Tensor, targets: IntBuffer, N: number, V: number): number {
  k.crossEntropyForward(losses.ptr, probs.ptr, logits.ptr, targets.ptr, N, V);
  let sum = 0;
  const l = losses.data;
  for (let i = 0; i < N; i++) sum += l[i];
  return sum / N;
}

/** dlogits = (written) gradient of the mean loss, times dloss */
export function crossEntropyBackward(k: Kernels, dlogits: Tensor, probs: Tensor, targets: IntBuffer, N: number, V: number, dloss = 1): void {
  k.crossEntropyBackward(dlogits.ptr, probs.ptr, targets.ptr, dloss / N, N, V);
}
