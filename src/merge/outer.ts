// The DiLoCo outer optimizer: Nesterov momentum on the merged pseudo-gradient.
//
//   m ← μ·m + Δ
//   θ ← θ_start − lr·(Δ + μ·m)
//
// Δ is the merged pseudo-gradient (θ_start − θ_local, aggregated over
// replicas), θ_start the weights every replica started the round from.
// Defaults lr = 0.7, μ = 0.9 (DiLoCo). Each element is computed in float64
// and rounded to float32 once, in a fixed order with no fused operations, so
// two replicas that apply the same Δ to the same θ_start with the same state
// get bitwise identical weights and momentum on any IEEE-754 machine.

import { findNonFinite } from '../protocol/codec.ts';
import { MergeError } from './errors.ts';

/** Hyperparameters of the outer optimizer. */
export interface OuterOptions {
  /** Outer learning rate (default 0.7). */
  lr?: number;
  /** Nesterov momentum μ in [0, 1) (default 0.9). */
  momentum?: number;
}

/** State of the outer optimizer of one stage; identical on every replica. */
export interface OuterState {
  /** Outer learning rate. */
  readonly lr: number;
  /** Momentum coefficient μ. */
  readonly momentum: number;
  /** Outer steps taken so far. */
  step: number;
  /** Momentum buffer m, one value per parameter. */
  readonly momentumBuffer: Float32Array;
}

export const DEFAULT_OUTER_LR = 0.7;
export const DEFAULT_OUTER_MOMENTUM = 0.9;

/** Fresh state (zero momentum, step 0) for `size` parameters. */
export function createOuterState(size: number, options: OuterOptions = {}): OuterState {
  if (!Number.isSafeInteger(size) || size < 0) throw new MergeError('bad_argument', `size must be a non-negative integer, got ${size}`);
  const lr = options.lr ?? DEFAULT_OUTER_LR;
  const momentum = options.momentum ?? DEFAULT_OUTER_MOMENTUM;
  checkHyper(lr, momentum);
  return { lr, momentum, step: 0, momentumBuffer: new Float32Array(size) };
}

/**
 * One outer step: updates `state` (momentum, step) and returns the new
 * weights θ_start − lr·(Δ + μ·m) in `out` (allocated when absent; may alias
 * `thetaStart`). Validates lengths and finite inputs before touching the
 * state, and throws MergeError 'non_finite' (state unchanged) if the step
 * would overflow float32.
 */
export function outerStep(state: OuterState, thetaStart: Float32Array, delta: Float32Array, out?: Float32Array): Float32Array {
  const m = state.momentumBuffer;
  const n = m.length;
  if (thetaStart.length !== n) throw new MergeError('length_mismatch', `thetaStart has ${thetaStart.length} values, state ${n}`);
  if (delta.length !== n) throw new MergeError('length_mismatch', `delta has ${delta.length} values, state ${n}`);
  const o = out ?? new Float32Array(n);
  if (o.length !== n) throw new MergeError('length_mismatch', `out has ${o.length} values, state ${n}`);
  let bad = findNonFinite(thetaStart);
  if (bad >= 0) throw new MergeError('non_finite', `thetaStart value ${bad} is ${thetaStart[bad]}`);
  bad = findNonFinite(delta);
  if (bad >= 0) throw new MergeError('non_finite', `delta value ${bad} is ${delta[bad]}`);
  const lr = state.lr;
  const mu = state.momentum;
  // first pass only checks, so a step that would overflow leaves everything untouched
  for (let i = 0; i < n; i++) {
    const d = delta[i];
    const mi = Math.fround(mu * m[i] + d);
    const t = Math.fround(thetaStart[i] - lr * (d + mu * mi));
    if (mi - mi !== 0 || t - t !== 0) throw new MergeError('non_finite', `outer step overflows float32 at parameter ${i}`);
  }
  for (let i = 0; i < n; i++) {
    const d = delta[i];
    const mi = Math.fround(mu * m[i] + d);
    m[i] = mi;
    o[i] = thetaStart[i] - lr * (d + mu * mi);
  }
  state.step++;
  return o;
}

function checkHyper(lr: number, momentum: number): void {
  if (!(Number.isFinite(lr) && lr > 0)) throw new MergeError('bad_argument', `outer lr must be finite and positive, got ${lr}`);
  if (!(momentum >= 0 && momentum < 1)) throw new MergeError('bad_argument', `outer momentum must be in [0, 1), got ${momentum}`);
}
