// Finite-difference gradient checks: perturb sampled coordinates of an input
// by ±eps, recompute a scalar loss in double precision, compare with the
// analytic gradient.
import assert from 'node:assert/strict';
import { mulberry32 } from '../../src/model/init.ts';

export interface GradCheckOptions {
  samples?: number;
  eps?: number;
  /** tolerance: |num − ana| ≤ atol + rtol · max(|num|, |ana|) */
  atol?: number;
  rtol?: number;
  seed?: number;
}

/** Checks `grad` (analytic) against central differences of `loss` in the entries of `x`. */
export function checkGradient(name: string, x: Float32Array, grad: Float32Array, loss: () => number, options: GradCheckOptions = {}): void {
  const { samples = 24, eps = 1e-2, atol = 2e-3, rtol = 2e-2, seed = 7 } = options;
  assert.equal(grad.length, x.length, `${name}: gradient length`);
  const rand = mulberry32(seed);
  let checked = 0;
  for (let s = 0; s < Math.min(samples, x.length); s++) {
    const i = samples >= x.length ? s : Math.floor(rand() * x.length);
    const orig = x[i];
    x[i] = orig + eps;
    const lp = loss();
    x[i] = orig - eps;
    const lm = loss();
    x[i] = orig;
    const num = (lp - lm) / (2 * eps);
    const ana = grad[i];
    const tol = atol + rtol * Math.max(Math.abs(num), Math.abs(ana));
    assert.ok(Math.abs(num - ana) <= tol, `${name}[${i}]: analytic ${ana} vs numeric ${num} (tolerance ${tol.toExponential(2)})`);
    checked++;
  }
  assert.ok(checked > 0);
  // the check is meaningless if every gradient is zero
  assert.ok(grad.some((g) => Math.abs(g) > 1e-6), `${name}: gradient is all zero`);
}

/** Σ out·weights in double precision. */
export function weightedSum(out: Float32Array, weights: Float32Array): number {
  let s = 0;
  for (let i = 0; i < weights.length; i++) s += out[i] * weights[i];
  return s;
}

/** Fills with uniform values in [−scale, scale). */
export function fillRandom(x: Float32Array, seed: number, scale = 1): Float32Array {
  const r = mulberry32(seed);
  for (let i = 0; i < x.length; i++) x[i] = (r() * 2 - 1) * scale;
  return x;
}
