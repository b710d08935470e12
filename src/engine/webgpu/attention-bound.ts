// The exact (float64) causal attention forward and backward of float32
// inputs, and for every output element a bound E on how far any float32
// implementation of the algorithms of assembly/attention.ts (WASM) or
// attention.wgsl.ts (GPU) can land from it. So |impl − exact| ≤ E for each
// implementation, and |gpu − wasm| ≤ 2E.
//
// The bound is a first-order running error analysis (products of two error
// terms, ~1e-12 relative here, are dropped), u = 2⁻²⁴, γ(n) = n·u/(1 − n·u) (Higham, Accuracy
// and Stability of Numerical Algorithms, §3.1), for row i of one head, with
// n = i + 1 keys:
//   score    s_j = scale·q_i·k_j, hs products then ×scale, in any order, fused
//            or not: |δs_j| ≤ σ_j = γ(hs+1)·scale·Σ_d|q_d k_jd|;
//   exp      e_j = exp(s_j − m): the subtraction rounds (u·|x_j|, x_j = s_j − m)
//            and exp is within (3 + 2|x|) ulp, the accuracy WGSL and Vulkan
//            require of exp; WASM's exp4 (a Cephes-style polynomial) is taken
//            to be as good, which the tests' |wasm − exact| ≤ E checks:
//            τ_j = u|x_j| + (3 + 2|x_j|)·2⁻²³. The max m cancels in
//            e_j / Σe, so its own error does not count;
//   softmax  P_j = e_j / Σ_k e_k: δlog P_j = δs_j − Σ_k P_k δs_k (+ evaluation), so
//            |δP_j| ≤ P_j·ρ_j, ρ_j = σ_j + τ_j + Σ_k P_k(σ_k + τ_k) + γ(n+3) (the sum;
//            WASM adds up to 3 padding lanes) + 2u (1/l and the product) +
//            r·(u|x_min| + (3 + 2|x_min|)·2⁻²³ + 2u) for the GPU's r = ⌈n/KB⌉ − 1
//            online rescales of its running sum; plus 2⁻¹²⁵ for underflow.
//            The GPU backward recomputes P from the saved (m, l): the same terms;
//   out      Σ_j P_j v_j: E = Σ_j (|δP_j| + γ(n)·P_j)·|v_jd|;
//   dP_j     dout_i·v_j: γ(hs)·Σ_d|g_d v_jd|;
//   D_i      WASM Σ_j P_j dP_j, GPU dout_i·out_i: the larger of the two bounds;
//   dS_j     P_j(dP_j − D)·scale: from those, plus 3u for its three roundings;
//   dq, dk, dv  sums of n (or T − j) products of bounded terms, as out; with
//            grouped-query heads dk and dv sum over the kv head's H/KV query
//            heads too: (H/KV)·(T − j) terms.
// Either shape (attention.ts): multi-head (qkv B×T×3C) or grouped-query
// (qkv B×T×(H + 2KV)·D, out B×T×H·D, att B×H×T×T).
import { attentionScale, attentionWidths, gqaShapeOf, type AnyAttentionShape } from './attention.ts';
import { attentionTileRows } from './attention.wgsl.ts';
import { gamma } from './crosscheck.ts';

const U = 2 ** -24;
const ULP = 2 ** -23;
/** absolute slack for results that underflow (flushed subnormals; exp4 bottoms out at ~2⁻¹²⁶) */
const TINY = 2 ** -125;

export interface AttentionInputs {
  /** B×T×3C (grouped-query: B×T×(H + 2KV)·D) */
  qkv: Float32Array;
  /** B×T×C (B×T×H·D): the gradient flowing into out */
  dout: Float32Array;
}

/** Exact values and their per-element bounds, in the layouts of the kernels. */
export interface AttentionReference {
  out: Float64Array;
  outBound: Float64Array;
  /** B×NH×T×T, 0 (bound 0) above the diagonal */
  att: Float64Array;
  attBound: Float64Array;
  dqkv: Float64Array;
  dqkvBound: Float64Array;
}

/** Relative error of a float32 exp(x), in the accuracy WGSL and Vulkan require. */
function expError(x: number): number {
  return (3 + 2 * Math.abs(x)) * ULP;
}

/** Σ_d x[xi+d]·y[yi+d] into pair[0] and Σ_d |x[xi+d]·y[yi+d]| into pair[1], d < n. */
function dotAbs(x: Float32Array, xi: number, y: Float32Array, yi: number, n: number, pair: Float64Array): void {
  let dot = 0, abs = 0;
  for (let d = 0; d < n; d++) {
    const p = x[xi + d] * y[yi + d];
    dot += p;
    abs += Math.abs(p);
  }
  pair[0] = dot;
  pair[1] = abs;
}

/**
 * One term a·x of a sum of products and its error: out[oi+d] += a·x[xi+d],
 * bound[oi+d] += ea·|x[xi+d]| + g·|a·x[xi+d]| (ea bounds a's error, g the summation's γ).
 */
function addTerm(a: number, ea: number, g: number, x: Float32Array, xi: number, out: Float64Array, bound: Float64Array, oi: number, n: number): void {
  for (let d = 0; d < n; d++) {
    const v = x[xi + d];
    out[oi + d] += a * v;
    bound[oi + d] += ea * Math.abs(v) + g * Math.abs(a * v);
  }
}

/** The exact values of `s` on `inputs`, and their bounds. */
export function attentionReference(s: AnyAttentionShape, inputs: AttentionInputs): AttentionReference {
  const { B, T, H: NH, KV, D: hs } = gqaShapeOf(s);
  const { qkv: W, out: C } = attentionWidths(s);
  const rep = NH / KV, kb = attentionTileRows(hs);
  const scale = attentionScale(hs);
  const r: AttentionReference = {
    out: new Float64Array(B * T * C), outBound: new Float64Array(B * T * C),
    att: new Float64Array(B * NH * T * T), attBound: new Float64Array(B * NH * T * T),
    dqkv: new Float64Array(B * T * W), dqkvBound: new Float64Array(B * T * W),
  };
  // per row: scores, their errors, P and its error, dP and its error
  const sc = new Float64Array(T), sigma = new Float64Array(T), P = new Float64Array(T), EP = new Float64Array(T);
  const dP = new Float64Array(T), EdP = new Float64Array(T), pair = new Float64Array(2);
  const { qkv, dout } = inputs;
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < NH; h++) {
      const g = Math.floor(h / rep);
      const qAt = (t: number): number => (b * T + t) * W + h * hs;
      const kAt = (t: number): number => (b * T + t) * W + (NH + g) * hs; // v at + KV·hs
      const gAt = (t: number): number => (b * T + t) * C + h * hs;
      for (let i = 0; i < T; i++) {
        const n = i + 1, qi = qAt(i), gi = gAt(i);
        let m = -Infinity;
        for (let j = 0; j < n; j++) {
          dotAbs(qkv, qi, qkv, kAt(j), hs, pair);
          sc[j] = scale * pair[0];
          sigma[j] = gamma(hs + 1) * scale * pair[1];
          m = Math.max(m, sc[j]);
        }
        let Z = 0, xMin = 0;
        for (let j = 0; j < n; j++) {
          Z += Math.exp(sc[j] - m);
          xMin = Math.min(xMin, sc[j] - m);
        }
        let common = 0;
        for (let j = 0; j < n; j++) {
          P[j] = Math.exp(sc[j] - m) / Z;
          // σ_j + τ_j for now; the terms shared by the row are added below
          EP[j] = sigma[j] + U * Math.abs(sc[j] - m) + expError(sc[j] - m);
          common += P[j] * EP[j];
        }
        const rescales = Math.ceil(n / kb) - 1;
        common += gamma(n + 3) + 2 * U + rescales * (U * Math.abs(xMin) + expError(xMin) + 2 * U);
        // forward output, and the att the WASM forward saves
        const oi = gAt(i), ai = ((b * NH + h) * T + i) * T;
        for (let j = 0; j < n; j++) {
          EP[j] = P[j] * (EP[j] + common) + TINY;
          r.att[ai + j] = P[j];
          r.attBound[ai + j] = EP[j];
          addTerm(P[j], EP[j], gamma(n), qkv, kAt(j) + KV * hs, r.out, r.outBound, oi, hs);
        }
        // backward of row i: dP, D (either way), dS; dq_i, and row i's share of every dk_j, dv_j
        let D = 0, DAbs = 0, EDw = 0, EDg = 0, outDot = 0;
        for (let j = 0; j < n; j++) {
          dotAbs(dout, gi, qkv, kAt(j) + KV * hs, hs, pair);
          dP[j] = pair[0];
          EdP[j] = gamma(hs) * pair[1];
          D += P[j] * dP[j];
          DAbs += P[j] * Math.abs(dP[j]);
          EDw += EP[j] * Math.abs(dP[j]) + P[j] * EdP[j];
        }
        for (let d = 0; d < hs; d++) {
          outDot += Math.abs(dout[gi + d] * r.out[oi + d]);
          EDg += Math.abs(dout[gi + d]) * r.outBound[oi + d];
        }
        const ED = Math.max(EDw + gamma(n + 1) * DAbs, EDg + gamma(hs) * outDot);
        for (let j = 0; j < n; j++) {
          const diff = dP[j] - D;
          const dS = P[j] * diff * scale;
          const Eg = scale * (EP[j] * Math.abs(diff) + P[j] * (EdP[j] + ED) + 3 * U * P[j] * Math.abs(diff));
          const kj = kAt(j);
          addTerm(dS, Eg, gamma(n), qkv, kj, r.dqkv, r.dqkvBound, qi, hs); // dq_i += dS_ij k_j
          addTerm(dS, Eg, gamma(rep * (T - j)), qkv, qi, r.dqkv, r.dqkvBound, kj, hs); // dk_j += dS_ij q_i
          addTerm(P[j], EP[j], gamma(rep * (T - j)), dout, gi, r.dqkv, r.dqkvBound, kj + KV * hs, hs); // dv_j += P_ij dout_i
        }
      }
    }
  }
  return r;
}

/** How far `a` is from `b` against `factor`·bound, element by element. */
export interface BoundComparison {
  maxAbsDiff: number;
  /** max |a − b| / (factor·bound); ≤ 1 passes. An exact match is 0 even where the bound is 0; a NaN is Infinity */
  worstRatio: number;
  /** the element where worstRatio is reached */
  worstAt: number;
}

export function compareWithin(a: ArrayLike<number>, b: ArrayLike<number>, bound: ArrayLike<number>, factor: number): BoundComparison {
  if (a.length !== b.length || a.length !== bound.length) throw new RangeError(`compareWithin: lengths ${a.length}, ${b.length}, ${bound.length}`);
  let maxAbsDiff = 0, worstRatio = 0, worstAt = -1;
  for (let x = 0; x < a.length; x++) {
    const d = Math.abs(a[x] - b[x]);
    const ratio = d === 0 ? 0 : Number.isNaN(d) ? Infinity : d / (factor * bound[x]);
    maxAbsDiff = Number.isNaN(d) ? Infinity : Math.max(maxAbsDiff, d);
    if (ratio > worstRatio) {
      worstRatio = ratio;
      worstAt = x;
    }
  }
  return { maxAbsDiff, worstRatio, worstAt };
}
