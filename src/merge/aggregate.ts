// Aggregators: merge the same partition from R replicas into one slice.
//
// Every function takes R slices of equal length (decoded pseudo-gradient
// slices, one per replica) and writes one merged slice. Arithmetic is done in
// float64 and rounded to float32 once per element, visiting the slices in the
// order given: pass them in a canonical order (e.g. sorted by replica id) and
// every merger of a partition computes bitwise the same result.
//
//   weightedMean          Σ w_r x_r / Σ w_r (w = samples each replica processed; equal by default)
//   trimmedMean           per element, sort, drop k = floor(trim · R) lowest and highest, mean of the rest
//   median                per element, middle value (mean of the two middle values for even R)
//   signedGeometricMean   per element, s = sign(Σ x_r); s · geometric mean of |x_r| over the x_r with sign s
//
// Each validates its inputs (R ≥ 1, equal lengths, finite values, weights) and
// throws MergeError. No per-element allocation: order statistics sort a small
// float64 scratch array of R values per element with an insertion sort.

import { findNonFinite } from '../protocol/codec.ts';
import { MergeError } from './errors.ts';

/** Names of the aggregators. */
export type AggregatorName = 'mean' | 'trimmed-mean' | 'median' | 'signed-geometric-mean';

/** Every aggregator this build offers. */
export const AGGREGATORS: readonly AggregatorName[] = ['mean', 'trimmed-mean', 'median', 'signed-geometric-mean'];

/** Options of aggregate(). */
export interface AggregateOptions {
  /** Aggregator (default 'mean'). */
  method?: AggregatorName;
  /** 'mean' only: one non-negative weight per slice, positive sum (default equal). */
  weights?: readonly number[];
  /** 'trimmed-mean' only: fraction dropped at each end, in [0, 0.5) (default 0.2). */
  trim?: number;
}

/** Default fraction trimmed at each end by trimmedMean. */
export const DEFAULT_TRIM = 0.2;

/** Merges `slices` with the aggregator named in `options` (default: equal-weight mean). */
export function aggregate(slices: readonly Float32Array[], options: AggregateOptions = {}, out?: Float32Array): Float32Array {
  const method = options.method ?? 'mean';
  switch (method) {
    case 'mean':
      return weightedMean(slices, options.weights, out);
    case 'trimmed-mean':
      return trimmedMean(slices, options.trim ?? DEFAULT_TRIM, out);
    case 'median':
      return median(slices, out);
    case 'signed-geometric-mean':
      return signedGeometricMean(slices, out);
    default:
      throw new MergeError('bad_argument', `unknown aggregator ${JSON.stringify(method)}; known: ${AGGREGATORS.join(', ')}`);
  }
}

/**
 * Weighted mean Σ w_r x_r / Σ w_r per element. `weights` (default all 1) are
 * typically the samples each replica trained on since the last merge; they
 * must be finite, non-negative, one per slice, with a positive sum.
 */
export function weightedMean(slices: readonly Float32Array[], weights?: readonly number[], out?: Float32Array): Float32Array {
  const n = checkSlices(slices);
  const o = checkOut(out, n);
  const R = slices.length;
  const w = checkWeights(weights, R);
  if (weights === undefined || w.every((x) => x === w[0])) return meanOf(slices, o);
  let total = 0;
  for (let r = 0; r < R; r++) total += w[r];
  const wf = Float64Array.from(w);
  for (let i = 0; i < n; i++) {
    let sum = 0;
    for (let r = 0; r < R; r++) sum += wf[r] * slices[r][i];
    o[i] = sum / total;
  }
  return o;
}

/** Equal-weight mean of validated slices into `o`. */
function meanOf(slices: readonly Float32Array[], o: Float32Array): Float32Array {
  const n = o.length;
  const R = slices.length;
  if (R === 1) o.set(slices[0]);
  else {
    // element-major, summing r = 0..R-1 in float64: unrolled for small R, same order and result as the loop
    if (R === 2) {
      const [a, b] = slices;
      for (let i = 0; i < n; i++) o[i] = (a[i] + b[i]) / 2;
    } else if (R === 3) {
      const [a, b, c] = slices;
      for (let i = 0; i < n; i++) o[i] = (a[i] + b[i] + c[i]) / 3;
    } else if (R === 4) {
      const [a, b, c, d] = slices;
      for (let i = 0; i < n; i++) o[i] = (a[i] + b[i] + c[i] + d[i]) / 4;
    } else {
      for (let i = 0; i < n; i++) {
        let sum = 0;
        for (let r = 0; r < R; r++) sum += slices[r][i];
        o[i] = sum / R;
      }
    }
  }
  return o;
}

/**
 * Trimmed mean per element: sort the R values, drop k = floor(trim · R) from
 * each end, average the remaining R − 2k. With R ≤ 2, or whenever k = 0
 * (e.g. R ≤ 4 at trim 0.2), this is the plain mean. `trim` in [0, 0.5).
 */
export function trimmedMean(slices: readonly Float32Array[], trim: number = DEFAULT_TRIM, out?: Float32Array): Float32Array {
  if (!(trim >= 0 && trim < 0.5)) throw new MergeError('bad_argument', `trim must be in [0, 0.5), got ${trim}`);
  const n = checkSlices(slices);
  const R = slices.length;
  const k = R <= 2 ? 0 : Math.floor(trim * R);
  const o = checkOut(out, n);
  if (k === 0) return meanOf(slices, o);
  if (R - 2 * k <= 2) return medianOf(slices, o); // one or two middle values left: that is the median
  const scratch = new Float64Array(R);
  const keep = R - 2 * k;
  for (let i = 0; i < n; i++) {
    gatherSorted(slices, i, scratch);
    let s = 0;
    for (let j = k; j < R - k; j++) s += scratch[j];
    o[i] = s / keep;
  }
  return o;
}

/** Median per element; for even R the mean of the two middle values. */
export function median(slices: readonly Float32Array[], out?: Float32Array): Float32Array {
  return medianOf(slices, checkOut(out, checkSlices(slices)));
}

/** Median of validated slices into `o`. */
function medianOf(slices: readonly Float32Array[], o: Float32Array): Float32Array {
  const n = o.length;
  const R = slices.length;
  if (R <= 2) return meanOf(slices, o);
  if (R === 3) {
    // branch-free median of three: selects a value, so it equals the sorted middle exactly
    const [a, b, c] = slices;
    for (let i = 0; i < n; i++) {
      const x = a[i];
      const y = b[i];
      o[i] = Math.max(Math.min(x, y), Math.min(Math.max(x, y), c[i]));
    }
    return o;
  }
  if (R === 4) {
    // of four values {min1, max1, min2, max2} (two pairs), the overall min and max are min(min1, min2)
    // and max(max1, max2), so the two middle values are max(min1, min2) and min(max1, max2)
    const [a, b, c, d] = slices;
    for (let i = 0; i < n; i++) {
      const x = a[i];
      const y = b[i];
      const z = c[i];
      const w = d[i];
      const lo = Math.max(Math.min(x, y), Math.min(z, w));
      const hi = Math.min(Math.max(x, y), Math.max(z, w));
      o[i] = (lo + hi) / 2;
    }
    return o;
  }
  const scratch = new Float64Array(R);
  const mid = R >> 1;
  if (R % 2 === 1) {
    for (let i = 0; i < n; i++) {
      gatherSorted(slices, i, scratch);
      o[i] = scratch[mid];
    }
  } else {
    for (let i = 0; i < n; i++) {
      gatherSorted(slices, i, scratch);
      o[i] = (scratch[mid - 1] + scratch[mid]) / 2;
    }
  }
  return o;
}

/**
 * Signed geometric mean per element, a total definition of IOTA's
 * "element-wise geometric mean" for values of any sign:
 *
 *   s = sign(Σ_r x_r);  if s = 0 the result is 0;
 *   A = { r : sign(x_r) = s }   (non-empty when s ≠ 0; zeros never agree)
 *   result = s · (Π_{r∈A} |x_r|)^(1/|A|) = s · exp(mean_{r∈A} ln |x_r|)
 *
 * With a single agreeing value the result is that value exactly. The
 * magnitude lies between the smallest and largest agreeing magnitude, so an
 * outlier of the majority sign pulls it far less than it pulls the mean.
 */
export function signedGeometricMean(slices: readonly Float32Array[], out?: Float32Array): Float32Array {
  const n = checkSlices(slices);
  const o = checkOut(out, n);
  const R = slices.length;
  for (let i = 0; i < n; i++) {
    let sum = 0;
    for (let r = 0; r < R; r++) sum += slices[r][i];
    if (sum === 0) {
      o[i] = 0;
      continue;
    }
    let logs = 0;
    let count = 0;
    let last = 0;
    if (sum > 0) {
      for (let r = 0; r < R; r++) {
        const v = slices[r][i];
        if (v > 0) {
          logs += Math.log(v);
          count++;
          last = v;
        }
      }
      o[i] = count === 1 ? last : Math.exp(logs / count);
    } else {
      for (let r = 0; r < R; r++) {
        const v = slices[r][i];
        if (v < 0) {
          logs += Math.log(-v);
          count++;
          last = v;
        }
      }
      o[i] = count === 1 ? last : -Math.exp(logs / count);
    }
  }
  return o;
}

/** Writes the R values at `i` into `scratch` in ascending order (insertion sort). */
function gatherSorted(slices: readonly Float32Array[], i: number, scratch: Float64Array): void {
  const R = scratch.length;
  for (let r = 0; r < R; r++) {
    const v = slices[r][i];
    let j = r - 1;
    while (j >= 0 && scratch[j] > v) {
      scratch[j + 1] = scratch[j];
      j--;
    }
    scratch[j + 1] = v;
  }
}

/** Validates R ≥ 1 slices of one length with finite values; returns the length. */
function checkSlices(slices: readonly Float32Array[]): number {
  if (slices.length === 0) throw new MergeError('no_replicas', 'no slices to merge');
  const n = slices[0].length;
  for (let r = 0; r < slices.length; r++) {
    const s = slices[r];
    if (!(s instanceof Float32Array)) throw new MergeError('bad_argument', `slice ${r} is not a Float32Array`);
    if (s.length !== n) throw new MergeError('length_mismatch', `slice ${r} has ${s.length} values, slice 0 has ${n}`);
    const bad = findNonFinite(s);
    if (bad >= 0) throw new MergeError('non_finite', `slice ${r} value ${bad} is ${s[bad]}`);
  }
  return n;
}

function checkOut(out: Float32Array | undefined, n: number): Float32Array {
  if (out === undefined) return new Float32Array(n);
  if (out.length !== n) throw new MergeError('length_mismatch', `out has ${out.length} values, slices ${n}`);
  return out;
}

/** Validated weights (all 1 when absent). */
function checkWeights(weights: readonly number[] | undefined, R: number): readonly number[] {
  if (weights === undefined) return new Array<number>(R).fill(1);
  if (weights.length !== R) throw new MergeError('length_mismatch', `${weights.length} weights for ${R} slices`);
  let total = 0;
  for (let r = 0; r < R; r++) {
    const w = weights[r];
    if (typeof w !== 'number' || !Number.isFinite(w) || w < 0) throw new MergeError('bad_weights', `weight ${r} is ${w}; weights must be finite and non-negative`);
    total += w;
  }
  if (!(total > 0) || !Number.isFinite(total)) throw new MergeError('bad_weights', `weights sum to ${total}; the sum must be positive and finite`);
  return weights;
}
