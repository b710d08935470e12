// Comparing one GPT training step on the GPU (gpt-step.ts) with the WASM
// engine's step, tensor by tensor: the gradients against a relative
// tolerance, and the parameters after the first AdamW step against a bound
// that follows from it.
//
// The parameter bound. At step 1 AdamW's bias-corrected moments are m̂ = ĝ and
// √v̂ = |ĝ| (ĝ = s·g, s the clipping scale), so a weight moves by
// lr·(f(ĝ) + wd·θ) with f(x) = x / (|x| + ε). For any x and y,
// |f(x) − f(y)| ≤ min(2, 2|x − y| / (|x| + ε)) (same sign: the difference is
// ε|x − y| / ((|x| + ε)(|y| + ε)); opposite signs: |x|/(|x| + ε) ≤ d/(|x| + ε)
// and |y|/(|y| + ε) ≤ d/(d + ε) ≤ d/(|x| + ε) with d = |x − y| ≥ |x|). With
// the gradients within δ of each other, the weights after one step are within
// lr·min(2, 2sδ / (s|g| + ε)) plus the rounding of the update itself (a few
// ulps of f, of θ and of lr·f). Gradients that are 0 in exact arithmetic
// but noise on both backends (the key bias: softmax ignores a constant added
// to every score) have |g| ≈ δ, so their weights may legitimately differ by up
// to 2·lr after one step; the bound allows exactly that and no more.
import type { FlatLayout } from './gpt-buffers.ts';

export interface TensorDiff {
  name: string;
  /** max |gpu − wasm| over the tensor's gradient */
  gradDiff: number;
  /** max |wasm gradient| over the tensor */
  gradMax: number;
  /** gradDiff ÷ (gradRel · gradMax): above 1 fails */
  gradRatio: number;
  /** max over the tensor of |Δθ| ÷ its bound: above 1 fails */
  paramRatio: number;
}

export interface StepComparison {
  tensors: TensorDiff[];
  worstGrad: TensorDiff;
  worstParam: TensorDiff;
}

export interface StepCompareInput {
  layout: FlatLayout;
  wasmGrads: Float32Array;
  gpuGrads: Float32Array;
  /** parameters before the step (the same on both backends) */
  before: Float32Array;
  wasmAfter: Float32Array;
  gpuAfter: Float32Array;
  /** the tolerance on gradients, relative to each tensor's largest |gradient| */
  gradRel: number;
  lr: number;
  eps: number;
  /** the clipping scale the WASM step applied (gradClip / norm, or 1) */
  gradScale: number;
}

/** Float32 unit roundoff. */
const U = 2 ** -24;

/** Compares gradients and first-step parameters tensor by tensor (see the file's comment for the bound). */
export function compareFirstStep(c: StepCompareInput): StepComparison {
  const tensors = c.layout.entries.map((e): TensorDiff => {
    let gradDiff = 0, gradMax = 0;
    for (let i = e.offset; i < e.offset + e.size; i++) {
      gradDiff = Math.max(gradDiff, Math.abs(c.gpuGrads[i] - c.wasmGrads[i]));
      gradMax = Math.max(gradMax, Math.abs(c.wasmGrads[i]));
    }
    const delta = c.gradRel * gradMax * c.gradScale;
    let paramRatio = 0;
    for (let i = e.offset; i < e.offset + e.size; i++) {
      const g = Math.abs(c.wasmGrads[i]) * c.gradScale;
      const update = c.lr * (Math.min(2, (2 * delta) / (g + c.eps)) + 16 * U);
      const bound = update + 4 * U * (Math.abs(c.before[i]) + Math.abs(c.wasmAfter[i]));
      const d = Math.abs(c.gpuAfter[i] - c.wasmAfter[i]);
      paramRatio = Math.max(paramRatio, Number.isNaN(d) ? Infinity : d / bound);
    }
    const gradRatio = gradMax === 0 ? (gradDiff === 0 ? 0 : Infinity) : gradDiff / (c.gradRel * gradMax);
    return { name: e.name, gradDiff, gradMax, gradRatio: Number.isNaN(gradRatio) ? Infinity : gradRatio, paramRatio };
  });
  const worst = (key: 'gradRatio' | 'paramRatio'): TensorDiff => tensors.reduce((a, b) => (b[key] > a[key] ? b : a));
  return { tensors, worstGrad: worst('gradRatio'), worstParam: worst('paramRatio') };
}
