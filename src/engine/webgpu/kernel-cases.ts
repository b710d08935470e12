// Cases for kernel-check.ts: the element-wise, optimizer and embedding
// kernels on random inputs, each with its bound on |gpu − wasm| (rounding.ts;
// the row kernels are in kernel-cases-rows.ts). Kernels that are one
// correctly rounded operation per output, or sums taken in the same order on
// both backends, get a bound of 0: WGSL requires + − × to be correctly
// rounded, so the same operations in the same order give the same bits.
import { NORM_CHUNK, type AdamWArgs } from '../kernels.ts';
import { uploadTokens, type GpuTokens } from './embedding.ts';
import { VALUE, type KernelCase } from './kernel-check.ts';
import { add, between, div, exact, fma, mul, sqrt, sub, sum, tanh, type Bounded } from './rounding.ts';
import { SUMSQ_WG } from './optimizer.wgsl.ts';

export type Random = () => number;

/** n floats uniform in [lo, hi). */
export function uniform(n: number, random: Random, lo = -1, hi = 1): Float32Array {
  return Float32Array.from({ length: n }, () => lo + (hi - lo) * random());
}

/** n ints uniform in [0, limit). */
export function indices(n: number, random: Random, limit: number): Int32Array {
  return Int32Array.from({ length: n }, () => Math.floor(random() * limit));
}

/** One bound per element, from the float64 inputs of element i. */
export function boundsOf(n: number, bound: (i: number) => number): Float64Array {
  return Float64Array.from({ length: n }, (_, i) => bound(i));
}

const GELU_K = exact(Math.fround(0.7978845608028654));
const GELU_C = exact(Math.fround(0.044715));
const GELU_3C = exact(Math.fround(3 * Math.fround(0.044715)));
const HALF = exact(0.5), ONE = exact(1);

/** gelu(x) as assembly/elementwise.ts computes it. */
export function geluBounded(x: Bounded): Bounded {
  const t = tanh(mul(GELU_K, fma(GELU_C, mul(mul(x, x), x), x)));
  return mul(mul(HALF, x), add(ONE, t));
}

/** gelu'(x) as assembly/elementwise.ts computes it. */
export function geluGradBounded(x: Bounded): Bounded {
  const x2 = mul(x, x);
  const t = tanh(mul(GELU_K, fma(GELU_C, mul(x2, x), x)));
  const sech2 = sub(ONE, mul(t, t));
  const du = mul(GELU_K, fma(GELU_3C, x2, ONE));
  return mul(HALF, fma(mul(x, sech2), du, add(ONE, t)));
}

export type ElementwiseKernel = 'addForward' | 'accumulate' | 'geluForward' | 'geluBackward' | 'reluForward' | 'reluBackward';

/**
 * An element-wise kernel on n elements. Inputs in [−5, 5) cover GELU's
 * tails; a seventh of them are exactly 0, where ReLU's gradient is 0.
 */
export function elementwiseCase(kernel: ElementwiseKernel, n: number, random: Random): KernelCase {
  const inp = uniform(n, random, -5, 5).map((x, i) => (i % 7 === 3 ? 0 : x));
  const other = uniform(n, random), garbage = uniform(n, random, -9, 9);
  switch (kernel) {
    case 'addForward':
      return {
        kernel, arrays: { out: garbage, a: inp, b: other }, bounds: { out: 0 },
        wasm: (k, p) => k.add(p.out, p.a, p.b, n),
        gpu: (s, a) => s.elementwise.add(a.out, a.a, a.b, n),
      };
    case 'accumulate':
      return {
        kernel, arrays: { dst: inp, src: other }, bounds: { dst: 0 },
        wasm: (k, p) => k.accumulate(p.dst, p.src, n),
        gpu: (s, a) => s.elementwise.accumulate(a.dst, a.src, n),
      };
    case 'geluForward':
      return {
        kernel, arrays: { out: garbage, inp }, bounds: { out: boundsOf(n, (i) => between(geluBounded(exact(inp[i])))) },
        wasm: (k, p) => k.geluForward(p.out, p.inp, n),
        gpu: (s, a) => s.elementwise.geluForward(a.out, a.inp, n),
      };
    case 'geluBackward':
      return {
        kernel, arrays: { dinp: garbage, inp, dout: other },
        bounds: { dinp: boundsOf(n, (i) => between(mul(geluGradBounded(exact(inp[i])), exact(other[i])))) },
        wasm: (k, p) => k.geluBackward(p.dinp, p.inp, p.dout, n),
        gpu: (s, a) => s.elementwise.geluBackward(a.dinp, a.inp, a.dout, n),
      };
    case 'reluForward':
      return {
        kernel, arrays: { out: garbage, inp }, bounds: { out: 0 },
        wasm: (k, p) => k.reluForward(p.out, p.inp, n),
        gpu: (s, a) => s.elementwise.reluForward(a.out, a.inp, n),
      };
    case 'reluBackward':
      return {
        kernel, arrays: { dinp: garbage, inp, dout: other }, bounds: { dinp: 0 },
        wasm: (k, p) => k.reluBackward(p.dinp, p.inp, p.dout, n),
        gpu: (s, a) => s.elementwise.reluBackward(a.dinp, a.inp, a.dout, n),
      };
  }
}

/** AdamW's numbers: every argument but the arrays and their length. */
export type AdamWHyper = Omit<AdamWArgs, 'params' | 'grads' | 'm' | 'v' | 'n'>;

/** ADAMW_DEFAULTS of src/model/adamw.ts, at step 3 (bias corrections far from 1), with clipping halving the gradients. */
export const ADAMW_CASE: AdamWHyper = { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0.1, step: 3, gradScale: 0.5 };

/** One AdamW step on n parameters with moments as a few steps leave them. */
export function adamwCase(n: number, random: Random, h: AdamWHyper = ADAMW_CASE): KernelCase {
  const params = uniform(n, random, -0.2, 0.2), grads = uniform(n, random, -0.05, 0.05);
  const m = uniform(n, random, -0.01, 0.01), v = uniform(n, random, 1e-7, 1e-4);
  // every constant as the float32 both kernels receive
  const f = (x: number): Bounded => exact(Math.fround(x));
  const b1 = f(h.beta1), b2 = f(h.beta2), lr = f(h.lr), eps = f(h.eps), wd = f(h.weightDecay), gs = f(h.gradScale);
  const omb1 = f(1 - b1.v), omb2 = f(1 - b2.v);
  const bc1 = f(1 - Math.pow(h.beta1, h.step)), bc2 = f(1 - Math.pow(h.beta2, h.step));
  const bp = new Float64Array(n), bm = new Float64Array(n), bv = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    const g = mul(exact(grads[i]), gs);
    const mi = add(mul(b1, exact(m[i])), mul(omb1, g));
    const vi = add(mul(b2, exact(v[i])), mul(mul(omb2, g), g));
    const w = exact(params[i]);
    const step = div(div(mi, bc1), add(sqrt(div(vi, bc2)), eps));
    bp[i] = between(sub(w, mul(lr, add(step, mul(wd, w)))));
    bm[i] = between(mi);
    bv[i] = between(vi);
  }
  return {
    kernel: 'adamw', arrays: { params, grads, m, v }, bounds: { params: bp, m: bm, v: bv },
    wasm: (k, p) => k.adamw({ ...h, params: p.params, grads: p.grads, m: p.m, v: p.v, n }),
    gpu: (s, a) => s.optimizer.adamw({ ...h, params: a.params, grads: a.grads, m: a.m, v: a.v, n }),
  };
}

/**
 * adamwScaled: AdamW taking its gradient scale from a status array (as
 * clipScale leaves it: [scale, norm, 0, 0]) instead of a parameter; the WASM
 * twin is adamw with that scale, so the bounds are adamwCase's.
 */
export function adamwScaledCase(n: number, random: Random, h: AdamWHyper = ADAMW_CASE): KernelCase {
  const c = adamwCase(n, random, h);
  const status = Float32Array.of(h.gradScale, 1, 0, 0);
  return {
    ...c, kernel: 'adamwScaled', arrays: { ...c.arrays, status },
    gpu: (s, a) => s.optimizer.adamwScaled({ ...h, params: a.params, grads: a.grads, m: a.m, v: a.v, status: a.status, n }),
  };
}

/** adamPredict: the weights `steps` AdamW steps ahead, θ − k · m̂ / (√v̂ + ε), from moments as a few steps leave them (step 3). */
export function adamPredictCase(n: number, random: Random, h: AdamWHyper = ADAMW_CASE, steps = 2): KernelCase {
  const params = uniform(n, random, -0.2, 0.2), out = uniform(n, random, -9, 9);
  const m = uniform(n, random, -0.01, 0.01), v = uniform(n, random, 1e-7, 1e-4);
  const k = steps * h.lr, bc1 = 1 - Math.pow(h.beta1, h.step), bc2 = 1 - Math.pow(h.beta2, h.step);
  // the float32 constants both kernels use: 1/bc1 and 1/bc2 as float32 divisions of float32 values
  const ib1 = exact(Math.fround(1 / Math.fround(bc1))), ib2 = exact(Math.fround(1 / Math.fround(bc2)));
  const kk = exact(Math.fround(k)), eps = exact(Math.fround(h.eps));
  const bounds = boundsOf(n, (i) => between(sub(exact(params[i]), mul(kk, div(mul(exact(m[i]), ib1), add(sqrt(mul(exact(v[i]), ib2)), eps))))));
  return {
    kernel: 'adamPredict', arrays: { out, params, m, v }, bounds: { out: bounds },
    wasm: (kr, p) => kr.adamPredict(p.out, p.params, p.m, p.v, n, k, bc1, bc2, h.eps),
    gpu: (s, a) => s.optimizer.adamPredict(a.out, a.params, a.m, a.v, n, k, bc1, bc2, h.eps),
  };
}

/**
 * Sum of squares of n floats. Both backends sum each NORM_CHUNK chunk in
 * float32 (WASM: 4 SIMD lanes of chunk/4 terms; GPU: SUMSQ_WG invocations of
 * chunk/SUMSQ_WG terms, then a tree) and add the chunks in float64, which
 * adds next to nothing (2⁻⁵⁰ relative is allowed for it).
 */
export function sumSquaresCase(n: number, random: Random): KernelCase {
  const x = uniform(n, random);
  const chunks: Bounded[] = [];
  for (let s = 0; s < n; s += NORM_CHUNK) {
    const len = Math.min(NORM_CHUNK, n - s);
    const depth = Math.max(Math.ceil(len / 4) + 1, Math.ceil(len / SUMSQ_WG) - 1 + Math.log2(SUMSQ_WG));
    chunks.push(sum(Array.from(x.subarray(s, s + len), (a) => mul(exact(a), exact(a))), depth));
  }
  const total = chunks.reduce((a, c) => ({ v: a.v + c.v, e: a.e + c.e }), exact(0));
  return {
    kernel: 'sumSquares', arrays: { x }, bounds: { [VALUE]: between(total) + 2 ** -50 * total.v },
    wasm: (k, p) => k.sumSquares(p.x, n),
    gpu: (s, a) => s.optimizer.sumSquares(a.x, n),
  };
}

/** Embedding sizes: batch B of T tokens from a vocabulary of V, C channels. */
export interface EmbeddingSize {
  B: number;
  T: number;
  C: number;
  V: number;
}

/**
 * embeddingForward or embeddingBackward. Tokens repeat (V is small next to
 * B·T) and some vocabulary rows are never used. Both are exact: the forward
 * pass is one addition per output; the backward pass adds each gradient's
 * terms in the WASM kernel's order (embedding.wgsl.ts).
 */
export function embeddingCase(kernel: 'embeddingForward' | 'embeddingBackward', z: EmbeddingSize, random: Random): KernelCase {
  const { B, T, C, V } = z, N = B * T;
  const tokens = indices(N, random, V - 2);
  if (kernel === 'embeddingForward') {
    return {
      kernel, arrays: { out: uniform(N * C, random), tokens, wte: uniform(V * C, random), wpe: uniform(T * C, random) }, bounds: { out: 0 },
      wasm: (k, p) => k.embeddingForward(p.out, p.tokens, p.wte, p.wpe, B, T, C),
      gpu: (s, a) => withTokens(s.device, tokens, V, (t) => s.embedding.embeddingForward(a.out, t, a.wte, a.wpe, B, T, C)),
    };
  }
  return {
    kernel, arrays: { dwte: uniform(V * C, random), dwpe: uniform(T * C, random), dout: uniform(N * C, random), tokens }, bounds: { dwte: 0, dwpe: 0 },
    wasm: (k, p) => k.embeddingBackward(p.dwte, p.dwpe, p.dout, p.tokens, B, T, C),
    gpu: (s, a) => withTokens(s.device, tokens, V, (t) => s.embedding.embeddingBackward(a.dwte, a.dwpe, a.dout, t, B, T, C)),
  };
}

function withTokens(device: GPUDevice, tokens: Int32Array, V: number, run: (t: GpuTokens) => void): void {
  const t = uploadTokens(device, tokens, V);
  try {
    run(t);
  } finally {
    t.destroy();
  }
}
