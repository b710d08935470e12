// AdamW over one stage's flat parameter buffer: decoupled weight decay on the
// decay range (matrices, embeddings), none on biases and norm gains, and
// optional global-norm gradient clipping. Moments are flat buffers too.
import type { Engine } from '../engine/engine.ts';
import type { Tensor } from '../engine/tensor.ts';
import type { FlatTensors } from './params.ts';

export interface AdamWConfig {
  lr: number;
  beta1: number;
  beta2: number;
  eps: number;
  weightDecay: number;
  /** clip the global gradient norm to this value; 0 disables */
  gradClip: number;
}

export const ADAMW_DEFAULTS: AdamWConfig = { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0.1, gradClip: 1.0 };

/**
 * The most |m̂ / (√v̂ + ε)| can be, at any step and for any gradients:
 * m̂ / √v̂ = [(1−β1)/(1−β1^t)] Σ β1^k g_k / √([(1−β2)/(1−β2^t)] Σ β2^k g_k²),
 * and by Cauchy–Schwarz |Σ β1^k g_k| ≤ √(Σ β2^k g_k²) · √(Σ (β1²/β2)^k), so
 * the ratio is at most (1−β1)/√(1−β2) / √(1 − β1²/β2) as t grows (and less
 * before): 7.27 for β = (0.9, 0.999). Gradient clipping scales m and √v alike
 * and changes nothing.
 */
export function adamStepBound(beta1: number = ADAMW_DEFAULTS.beta1, beta2: number = ADAMW_DEFAULTS.beta2): number {
  return (1 - beta1) / Math.sqrt(1 - beta2) / Math.sqrt(1 - (beta1 * beta1) / beta2);
}

/**
 * The furthest `steps` AdamW updates at `lr` can move a weight that started
 * at `w0`: each moves it by lr·(m̂/(√v̂+ε) + wd·w), at most lr·(B + wd·|w|),
 * and |w| stays within |w0| + steps·lr·B, so
 *   |w − w0| ≤ steps·lr·B + steps·lr·wd·(|w0| + steps·lr·B).
 * `weightDecay` is 0 for parameters without decay (biases, norm gains).
 */
export function adamMoveBound(w0: number, steps: number, lr: number, weightDecay: number, beta1?: number, beta2?: number): number {
  const { base, perWeight } = adamMoveBoundTerms(steps, lr, weightDecay, beta1, beta2);
  return base + perWeight * Math.abs(w0);
}

/** adamMoveBound as base + perWeight·|w0|: the same for every weight of one decay class, so a check over many weights computes it once. */
export function adamMoveBoundTerms(steps: number, lr: number, weightDecay: number, beta1?: number, beta2?: number): { base: number; perWeight: number } {
  const drift = steps * lr * adamStepBound(beta1, beta2);
  const perWeight = steps * lr * weightDecay;
  return { base: drift + perWeight * drift, perWeight };
}

/**
 * The furthest a weight can be from `theta0` after `steps` honest AdamW
 * steps (`adamMoveBound`), with room for float32
 * rounding: the tightest bound that holds for every gradient sequence.
 */
export function reach(theta0: number, decays: boolean, steps: number, lr: number): number {
  const { base, perWeight } = reachTerms(decays, steps, lr);
  return base + perWeight * Math.abs(theta0);
}

/** reach() as base + perWeight·|θ0|, the same for every weight of one decay class. */
function reachTerms(decays: boolean, steps: number, lr: number): { base: number; perWeight: number } {
  const t = adamMoveBoundTerms(steps, lr, decays ? ADAMW_DEFAULTS.weightDecay : 0);
  return { base: t.base * (1 + 1e-6) + 1e-6, perWeight: t.perWeight * (1 + 1e-6) + 1e-6 };
}

/** The first weight of `w` that `steps` AdamW steps from `theta0` cannot reach (−1: none). Floats [0, decaySize) take weight decay. */
export function firstOutOfReach(w: Float32Array, theta0: Float32Array, decaySize: number, steps: number, lr: number): number {
  // reach() with its terms computed once per decay class
  for (const [from, to, decays] of [[0, Math.min(decaySize, w.length), true], [decaySize, w.length, false]] as const) {
    const { base, perWeight } = reachTerms(decays, steps, lr);
    for (let i = from; i < to; i++) {
      if (!(Math.abs(w[i] - theta0[i]) <= base + perWeight * Math.abs(theta0[i]))) return i;
    }
  }
  return -1;
}

export class AdamW {
  readonly m: Tensor;
  readonly v: Tensor;
  /** steps taken */
  step = 0;
  /** predict()'s output inside the engine's memory (allocated on first use) */
  private scratch: Tensor | null = null;

  constructor(
    private readonly engine: Engine,
    private readonly params: FlatTensors,
    private readonly grads: FlatTensors,
    readonly config: AdamWConfig = ADAMW_DEFAULTS,
  ) {
    this.m = engine.tensor([params.layout.size]);
    this.v = engine.tensor([params.layout.size]);
  }

  /** L2 norm of the gradients (fixed summation order). */
  gradNorm(): number {
    return Math.sqrt(this.engine.kernels.sumSquares(this.grads.flat.ptr, this.grads.layout.size));
  }

  /**
   * One update from the current gradients. `normSquaredOverride` lets a caller
   * clip by a norm computed over several stages. Returns the gradient norm used.
   */
  update(lr: number = this.config.lr, normSquaredOverride?: number): number {
    const c = this.config;
    const norm = Math.sqrt(normSquaredOverride ?? this.engine.kernels.sumSquares(this.grads.flat.ptr, this.grads.layout.size));
    const scale = c.gradClip > 0 && norm > c.gradClip ? c.gradClip / norm : 1;
    this.step++;
    const layout = this.params.layout;
    const ranges: [number, number, number][] = [
      [0, layout.decaySize, c.weightDecay],
      [layout.decaySize, layout.size, 0],
    ];
    for (const [start, end, wd] of ranges) {
      if (end <= start) continue;
      this.engine.kernels.adamw({
        params: this.params.flat.ptr + start * 4,
        grads: this.grads.flat.ptr + start * 4,
        m: this.m.ptr + start * 4,
        v: this.v.ptr + start * 4,
        n: end - start,
        lr, beta1: c.beta1, beta2: c.beta2, eps: c.eps, weightDecay: wd,
        step: this.step,
        gradScale: scale,
      });
    }
    return norm;
  }

  /**
   * Where `steps` more updates are likely to take the weights, from the
   * current moments (SpecTrain-style weight prediction):
   * out = θ − steps · lr · m̂ / (√v̂ + ε), weight decay left out. Before the
   * first step it is θ. `out` may be a separate buffer of the same length.
   */
  predict(out: Float32Array, steps: number): Float32Array {
    const w = this.params.flat.data;
    if (out.length !== w.length) throw new RangeError(`predict: out has ${out.length} values, the parameters ${w.length}`);
    const t = this.step;
    if (t === 0 || steps <= 0) {
      out.set(w);
      return out;
    }
    const c = this.config;
    const n = this.params.layout.size;
    this.scratch ??= this.engine.tensor([n]);
    this.engine.kernels.adamPredict(this.scratch.ptr, this.params.flat.ptr, this.m.ptr, this.v.ptr, n, steps * c.lr, 1 - c.beta1 ** t, 1 - c.beta2 ** t, c.eps);
    out.set(this.scratch.data);
    return out;
  }

  release(): void {
    this.engine.free(this.m);
    this.engine.free(this.v);
    if (this.scratch) this.engine.free(this.scratch);
    this.scratch = null;
  }
}
