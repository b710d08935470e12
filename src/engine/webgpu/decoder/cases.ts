// Cases for ../kernel-check.ts: RMSNorm, RoPE and SwiGLU on random inputs,
// each with its bound on |gpu − wasm| (../rounding.ts: each backend within e
// of the float64 value of the same formula, so 2e between them). The row sums
// run in different orders (4 SIMD lanes and a scalar tail on WASM, a
// workgroup tree on the GPU), so their terms carry γ(depth); the RMSNorm
// weight gradient sums rows in the same order on both but each term is an fma
// either may fuse. RoPE is two products and a sum per output and SwiGLU uses
// the same ported exp, but a ÷ (WGSL 2.5 ulp) and possible contractions keep
// both off 0.
import type { KernelCase } from '../kernel-check.ts';
import { boundsOf, indices, uniform, type Random } from '../kernel-cases.ts';
import { add, between, div, exact, exp, fma, inverseSqrt, mul, sub, sum, type Bounded } from '../rounding.ts';
import { ROW_WG } from './decoder.wgsl.ts';

/** N rows of C channels, inputs x = scale·[−1, 1). */
export interface RmsSize {
  N: number;
  C: number;
  scale?: number;
  eps?: number;
}

const ONE = exact(1);

/** Additions a term of a C-term row sum goes through, on either backend. */
function rmsDepth(C: number): number {
  const wasm = Math.floor(C / 4) + 1 + (C % 4);
  const gpu = Math.ceil(C / ROW_WG) - 1 + Math.log2(ROW_WG);
  return Math.max(wasm, gpu);
}

/** The float32 rstd of each row, computed in float64 (an input of the backward kernels). */
export function rmsStats(x: Float32Array, N: number, C: number, eps: number): Float32Array {
  return Float32Array.from({ length: N }, (_, r) => {
    let q = 0;
    for (let c = 0; c < C; c++) q += x[r * C + c] ** 2;
    return 1 / Math.sqrt(q / C + eps);
  });
}

export function rmsnormForwardCase(z: RmsSize, random: Random): KernelCase {
  const { N, C } = z, eps = z.eps ?? 1e-5, scale = z.scale ?? 1;
  const inp = uniform(N * C, random, -scale, scale), w = uniform(C, random, 0.5, 1.5);
  const bout = new Float64Array(N * C), brstd = new Float64Array(N);
  const invC = exact(Math.fround(1 / C)), e = exact(Math.fround(eps)), depth = rmsDepth(C);
  for (let r = 0; r < N; r++) {
    const xs = Array.from(inp.subarray(r * C, (r + 1) * C), exact);
    const rs = inverseSqrt(add(mul(sum(xs.map((x) => mul(x, x)), depth), invC), e));
    xs.forEach((x, c) => (bout[r * C + c] = between(mul(mul(x, rs), exact(w[c])))));
    brstd[r] = between(rs);
  }
  return {
    kernel: 'rmsnormForward',
    arrays: { out: uniform(N * C, random), rstd: uniform(N, random), inp, w },
    bounds: { out: bout, rstd: brstd },
    wasm: (k, p) => k.rmsnormForward(p.out, p.rstd, p.inp, p.w, eps, N, C),
    gpu: (s, a) => s.decoder.rmsnormForward(a.out, a.rstd, a.inp, a.w, eps, N, C),
  };
}

function backwardInputs(z: RmsSize, random: Random): { inp: Float32Array; dout: Float32Array; w: Float32Array; rstd: Float32Array } {
  const scale = z.scale ?? 1, inp = uniform(z.N * z.C, random, -scale, scale);
  return { inp, dout: uniform(z.N * z.C, random), w: uniform(z.C, random, 0.5, 1.5), rstd: rmsStats(inp, z.N, z.C, z.eps ?? 1e-5) };
}

export function rmsnormBackwardInputCase(z: RmsSize, random: Random): KernelCase {
  const { N, C } = z;
  const { inp, dout, w, rstd } = backwardInputs(z, random);
  const dinp = uniform(N * C, random), bounds = new Float64Array(N * C);
  const invC = exact(Math.fround(1 / C)), depth = rmsDepth(C);
  for (let r = 0; r < N; r++) {
    const rs = exact(rstd[r]);
    const xh = Array.from({ length: C }, (_, c) => mul(exact(inp[r * C + c]), rs));
    const g = Array.from({ length: C }, (_, c) => mul(exact(dout[r * C + c]), exact(w[c])));
    const m = mul(sum(g.map((gc, c) => mul(gc, xh[c])), depth), invC);
    for (let c = 0; c < C; c++) bounds[r * C + c] = between(add(exact(dinp[r * C + c]), mul(sub(g[c], mul(xh[c], m)), rs)));
  }
  return {
    kernel: 'rmsnormBackwardInput',
    arrays: { dinp, dout, inp, w, rstd },
    bounds: { dinp: bounds },
    wasm: (k, p) => k.rmsnormBackwardInput(p.dinp, p.dout, p.inp, p.w, p.rstd, N, C),
    gpu: (s, a) => s.decoder.rmsnormBackwardInput(a.dinp, a.dout, a.inp, a.w, a.rstd, N, C),
  };
}

export function rmsnormBackwardParamsCase(z: RmsSize, random: Random): KernelCase {
  const { N, C } = z;
  const { inp, dout, rstd } = backwardInputs(z, random);
  const dw = uniform(C, random);
  const bdw = boundsOf(C, (c) => {
    const terms = Array.from({ length: N }, (_, r) => mul(exact(dout[r * C + c]), mul(exact(inp[r * C + c]), exact(rstd[r]))));
    return between(add(exact(dw[c]), sum(terms)));
  });
  return {
    kernel: 'rmsnormBackwardParams',
    arrays: { dw, dout, inp, rstd },
    bounds: { dw: bdw },
    wasm: (k, p) => k.rmsnormBackwardParams(p.dw, p.dout, p.inp, p.rstd, N, C),
    gpu: (s, a) => s.decoder.rmsnormBackwardParams(a.dw, a.dout, a.inp, a.rstd, N, C),
  };
}

/**
 * RoPE on `heads` heads of D at the start of rows `stride` floats apart;
 * positions in [0, P) at every posStride-th int32 from `posOffset` (the KV row
 * table is offset 1, stride 2); a table of P positions of random angles.
 */
export interface RopeSize {
  rows: number;
  heads: number;
  D: number;
  stride: number;
  P: number;
  posStride?: number;
  posOffset?: number;
  inPlace?: boolean;
}

export function ropeCase(kernel: 'ropeForward' | 'ropeBackward', z: RopeSize, random: Random): KernelCase {
  const { rows, heads, D, stride, P } = z, half = D / 2;
  const posStride = z.posStride ?? 1, posOffset = z.posOffset ?? 0;
  const positions = indices(posOffset + (rows - 1) * posStride + 1, random, P);
  const table = new Float32Array(P * D);
  for (let q = 0; q < P; q++) {
    for (let i = 0; i < half; i++) {
      const angle = Math.fround(q * Math.fround(Math.pow(10000, -(2 * i) / D)));
      table[q * D + i] = Math.cos(angle);
      table[q * D + half + i] = Math.sin(angle);
    }
  }
  const inp = uniform(rows * stride, random), out = uniform(rows * stride, random, -9, 9);
  const sign = kernel === 'ropeForward' ? 1 : -1;
  const target = z.inPlace ? inp : out;
  const bounds = new Float64Array(rows * stride); // 0 outside the heads: untouched there
  for (let r = 0; r < rows; r++) {
    const pos = positions[posOffset + r * posStride];
    for (let h = 0; h < heads; h++) {
      for (let i = 0; i < half; i++) {
        const k = r * stride + h * D + i;
        const c = exact(table[pos * D + i]), s = exact(sign * table[pos * D + half + i]);
        const x1 = exact(inp[k]), x2 = exact(inp[k + half]);
        bounds[k] = between(sub(mul(x1, c), mul(x2, s)));
        bounds[k + half] = between(add(mul(x2, c), mul(x1, s)));
      }
    }
  }
  const name = z.inPlace ? 'inp' : 'out';
  return {
    kernel: z.inPlace ? `${kernel} in place` : kernel,
    arrays: z.inPlace ? { inp, positions, table } : { out: target, inp, positions, table },
    bounds: { [name]: bounds },
    wasm: (k, p) => k[kernel](z.inPlace ? p.inp : p.out, p.inp, rows, heads, D, stride, p.positions + 4 * posOffset, posStride, p.table),
    gpu: (s, a) => {
      const pos = 'array' in a.positions ? { array: a.positions.array, offset: a.positions.offset + posOffset } : { array: a.positions, offset: posOffset };
      s.decoder[kernel](z.inPlace ? a.inp : a.out, a.inp, rows, heads, D, stride, pos, posStride, a.table, P);
    },
  };
}

/** σ(x) as both backends compute it: 1 / (1 + exp(−x)) with the ported exp. */
function sigmoidBounded(x: number): Bounded {
  return div(ONE, add(ONE, exp(exact(-x))));
}

/** N rows of the fused [gate | up] projection, 2I floats each; gates in [−spread, spread). */
export interface SwigluSize {
  N: number;
  I: number;
  spread?: number;
}

function swigluInputs(z: SwigluSize, random: Random): Float32Array {
  const spread = z.spread ?? 6, inp = uniform(2 * z.N * z.I, random);
  for (let r = 0; r < z.N; r++) for (let c = 0; c < z.I; c++) inp[r * 2 * z.I + c] = (random() * 2 - 1) * spread;
  return inp;
}

export function swigluForwardCase(z: SwigluSize, random: Random): KernelCase {
  const { N, I } = z, inp = swigluInputs(z, random);
  const bounds = boundsOf(N * I, (e) => {
    const g = Math.floor(e / I) * 2 * I + (e % I), x = inp[g];
    return between(mul(mul(exact(x), sigmoidBounded(x)), exact(inp[g + I])));
  });
  return {
    kernel: 'swigluForward',
    arrays: { out: uniform(N * I, random), inp },
    bounds: { out: bounds },
    wasm: (k, p) => k.swigluForward(p.out, p.inp, N, I),
    gpu: (s, a) => s.decoder.swigluForward(a.out, a.inp, N, I),
  };
}

export function swigluBackwardCase(z: SwigluSize, random: Random): KernelCase {
  const { N, I } = z, inp = swigluInputs(z, random), dout = uniform(N * I, random);
  const bounds = new Float64Array(2 * N * I);
  for (let r = 0; r < N; r++) {
    for (let c = 0; c < I; c++) {
      const g = r * 2 * I + c, x = exact(inp[g]), dy = exact(dout[r * I + c]), sg = sigmoidBounded(inp[g]);
      const dsilu = mul(sg, fma(x, sub(ONE, sg), ONE));
      bounds[g] = between(mul(mul(dy, exact(inp[g + I])), dsilu));
      bounds[g + I] = between(mul(dy, mul(x, sg)));
    }
  }
  return {
    kernel: 'swigluBackward',
    arrays: { dinp: uniform(2 * N * I, random, -9, 9), inp, dout },
    bounds: { dinp: bounds },
    wasm: (k, p) => k.swigluBackward(p.dinp, p.inp, p.dout, N, I),
    gpu: (s, a) => s.decoder.swigluBackward(a.dinp, a.inp, a.dout, N, I),
  };
}
