// Cases for kernel-check.ts: the row kernels (layer norm, bias gradients,
// softmax cross-entropy) on random inputs, each with its bound on
// |gpu − wasm| (rounding.ts). Row statistics are summed in different orders
// on the two backends (rows.wgsl.ts), so their bounds carry γ(depth) terms;
// parameter gradients sum rows in the same order on both, so biasBackward and
// the bias half of layernormBackwardParams are exact.
import type { KernelCase } from './kernel-check.ts';
import { boundsOf, indices, uniform, type Random } from './kernel-cases.ts';
import { add, between, div, exact, exp, fma, inverseSqrt, log, mul, rowSumDepth, sub, sum, type Bounded } from './rounding.ts';
import { LAYERNORM_EPS, ROW_WG } from './rows.wgsl.ts';

/** N rows of C channels; `scale` and `shift` set the inputs' spread and mean (x = shift + scale·[−1, 1)). */
export interface RowSize {
  N: number;
  C: number;
  scale?: number;
  shift?: number;
}

const EPS = exact(Math.fround(LAYERNORM_EPS));

/** The float32 mean and rstd of each row, computed in float64 (inputs of the backward kernels). */
export function rowStats(x: Float32Array, N: number, C: number): { mean: Float32Array; rstd: Float32Array } {
  const mean = new Float32Array(N), rstd = new Float32Array(N);
  for (let r = 0; r < N; r++) {
    const row = x.subarray(r * C, (r + 1) * C);
    const m = row.reduce((a, b) => a + b, 0) / C;
    mean[r] = m;
    rstd[r] = 1 / Math.sqrt(row.reduce((a, b) => a + (b - m) ** 2, 0) / C + LAYERNORM_EPS);
  }
  return { mean, rstd };
}

export function layernormForwardCase(z: RowSize, random: Random): KernelCase {
  const { N, C } = z;
  const inp = uniform(N * C, random, (z.shift ?? 0) - (z.scale ?? 1), (z.shift ?? 0) + (z.scale ?? 1));
  const w = uniform(C, random, 0.5, 1.5), b = uniform(C, random, -0.2, 0.2);
  const bout = new Float64Array(N * C), bmean = new Float64Array(N), brstd = new Float64Array(N);
  const invC = exact(Math.fround(1 / C)), depth = rowSumDepth(C, ROW_WG, true);
  for (let r = 0; r < N; r++) {
    const xs = Array.from(inp.subarray(r * C, (r + 1) * C), exact);
    const m = mul(sum(xs, depth), invC);
    const d = xs.map((x) => sub(x, m));
    const rs = inverseSqrt(add(mul(sum(d.map((v) => mul(v, v)), depth), invC), EPS));
    d.forEach((v, c) => (bout[r * C + c] = between(fma(mul(v, rs), exact(w[c]), exact(b[c])))));
    bmean[r] = between(m);
    brstd[r] = between(rs);
  }
  return {
    kernel: 'layernormForward',
    arrays: { out: uniform(N * C, random), mean: uniform(N, random), rstd: uniform(N, random), inp, w, b },
    bounds: { out: bout, mean: bmean, rstd: brstd },
    wasm: (k, p) => k.layernormForward(p.out, p.mean, p.rstd, p.inp, p.w, p.b, N, C),
    gpu: (s, a) => s.rows.layernormForward(a.out, a.mean, a.rstd, a.inp, a.w, a.b, N, C),
  };
}

/** Layer-norm backward inputs: x, dout, weight and the float32 row statistics. */
function backwardInputs(z: RowSize, random: Random): { inp: Float32Array; dout: Float32Array; w: Float32Array; mean: Float32Array; rstd: Float32Array } {
  const inp = uniform(z.N * z.C, random, (z.shift ?? 0) - (z.scale ?? 1), (z.shift ?? 0) + (z.scale ?? 1));
  return { inp, dout: uniform(z.N * z.C, random), w: uniform(z.C, random, 0.5, 1.5), ...rowStats(inp, z.N, z.C) };
}

/** x̂ = (x − mean) · rstd, as both kernels compute it. */
function xhat(x: number, mean: number, rstd: number): Bounded {
  return mul(sub(exact(x), exact(mean)), exact(rstd));
}

export function layernormBackwardInputCase(z: RowSize, random: Random): KernelCase {
  const { N, C } = z;
  const { inp, dout, w, mean, rstd } = backwardInputs(z, random);
  const dinp = uniform(N * C, random);
  const bounds = new Float64Array(N * C);
  const invC = exact(Math.fround(1 / C)), depth = rowSumDepth(C, ROW_WG, true);
  for (let r = 0; r < N; r++) {
    const xh: Bounded[] = [], dn: Bounded[] = [];
    for (let c = 0; c < C; c++) {
      xh.push(xhat(inp[r * C + c], mean[r], rstd[r]));
      dn.push(mul(exact(dout[r * C + c]), exact(w[c])));
    }
    const m1 = mul(sum(dn, depth), invC), m2 = mul(sum(dn.map((d, c) => mul(d, xh[c])), depth), invC);
    for (let c = 0; c < C; c++) {
      const g = mul(sub(sub(dn[c], m1), mul(xh[c], m2)), exact(rstd[r]));
      bounds[r * C + c] = between(add(exact(dinp[r * C + c]), g));
    }
  }
  return {
    kernel: 'layernormBackwardInput',
    arrays: { dinp, dout, inp, w, mean, rstd },
    bounds: { dinp: bounds },
    wasm: (k, p) => k.layernormBackwardInput(p.dinp, p.dout, p.inp, p.w, p.mean, p.rstd, N, C),
    gpu: (s, a) => s.rows.layernormBackwardInput(a.dinp, a.dout, a.inp, a.w, a.mean, a.rstd, N, C),
  };
}

export function layernormBackwardParamsCase(z: RowSize, random: Random): KernelCase {
  const { N, C } = z;
  const { inp, dout, mean, rstd } = backwardInputs(z, random);
  const dw = uniform(C, random), db = uniform(C, random);
  const bdw = boundsOf(C, (c) => {
    const terms = Array.from({ length: N }, (_, r) => mul(exact(dout[r * C + c]), xhat(inp[r * C + c], mean[r], rstd[r])));
    return between(add(exact(dw[c]), sum(terms)));
  });
  return {
    kernel: 'layernormBackwardParams',
    arrays: { dw, db, dout, inp, mean, rstd },
    bounds: { dw: bdw, db: 0 },
    wasm: (k, p) => k.layernormBackwardParams(p.dw, p.db, p.dout, p.inp, p.mean, p.rstd, N, C),
    gpu: (s, a) => s.rows.layernormBackwardParams(a.dw, a.db, a.dout, a.inp, a.mean, a.rstd, N, C),
  };
}

/** biasBackward on any C (the WASM kernel takes C not a multiple of 4 too). */
export function biasBackwardCase(z: RowSize, random: Random): KernelCase {
  const { N, C } = z;
  return {
    kernel: 'biasBackward',
    arrays: { dbias: uniform(C, random), dout: uniform(N * C, random) },
    bounds: { dbias: 0 },
    wasm: (k, p) => k.biasBackward(p.dbias, p.dout, N, C),
    gpu: (s, a) => s.rows.biasBackward(a.dbias, a.dout, N, C),
  };
}

/** N rows of V logits, uniform in [−spread, spread). */
export interface CrossEntropySize {
  N: number;
  V: number;
  spread?: number;
}

/**
 * Softmax cross-entropy forward. The row max is exact on both backends; each
 * exp is the same ported algorithm; the row sum differs in order (WASM: 4
 * lanes when V is a multiple of 4, else in order).
 */
export function crossEntropyForwardCase(z: CrossEntropySize, random: Random): KernelCase {
  const { N, V } = z;
  const logits = uniform(N * V, random, -(z.spread ?? 4), z.spread ?? 4), targets = indices(N, random, V);
  const bprobs = new Float64Array(N * V), blosses = new Float64Array(N);
  const depth = rowSumDepth(V, ROW_WG, V % 4 === 0);
  for (let r = 0; r < N; r++) {
    const row = logits.subarray(r * V, (r + 1) * V);
    const m = exact(row.reduce((a, b) => Math.max(a, b), -Infinity));
    const e = Array.from(row, (l) => exp(sub(exact(l), m)));
    const total = sum(e, depth);
    const inv = div(exact(1), total);
    e.forEach((ec, c) => (bprobs[r * V + c] = between(mul(ec, inv))));
    blosses[r] = between(sub(log(total), sub(exact(row[targets[r]]), m)));
  }
  return {
    kernel: 'crossEntropyForward',
    arrays: { losses: uniform(N, random), probs: uniform(N * V, random), logits, targets },
    bounds: { losses: blosses, probs: bprobs },
    wasm: (k, p) => k.crossEntropyForward(p.losses, p.probs, p.logits, p.targets, N, V),
    gpu: (s, a) => s.rows.crossEntropyForward(a.losses, a.probs, a.logits, a.targets, N, V),
  };
}

/** Softmax cross-entropy backward with the mean-loss scale 1/N: one or two correctly rounded operations per output, exact. */
export function crossEntropyBackwardCase(z: CrossEntropySize, random: Random, scale: number = 1 / z.N): KernelCase {
  const { N, V } = z;
  return {
    kernel: 'crossEntropyBackward',
    arrays: { dlogits: uniform(N * V, random), probs: uniform(N * V, random, 0, 1), targets: indices(N, random, V) },
    bounds: { dlogits: 0 },
    wasm: (k, p) => k.crossEntropyBackward(p.dlogits, p.probs, p.targets, scale, N, V),
    gpu: (s, a) => s.rows.crossEntropyBackward(a.dlogits, a.probs, a.targets, scale, N, V),
  };
}
