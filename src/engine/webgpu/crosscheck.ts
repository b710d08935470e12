// Runs one matrix product on the WASM kernels and on the GPU with the same
// inputs and compares them against a rounding-error bound: the check that the
// GPU kernels compute what the WASM ones do (tests, the bench, and later a
// miner's self-check before it trusts its GPU).
//
// The bound. Each element is a sum of K products plus a base (the bias or the
// old C): K + 1 terms. Summed in any order in float32 (with or without fma),
// the computed sum differs from the exact one by at most
// γ(K+1)·(Σₖ|aᵢₖ|·|bₖⱼ| + |base|), γ(n) = n·u / (1 − n·u), u = 2⁻²⁴
// (Higham, Accuracy and Stability of Numerical Algorithms, §3.1). The GPU sums
// k in order in one accumulator; the WASM kernel sums blocks of k with SIMD
// lanes: different orders, so the two may differ by twice that. Elements of
// C outside the M×N window (row padding, the floats before the offset) must
// not change at all.
import type { Engine } from '../engine.ts';
import { readArray, uploadArray } from './buffers.ts';
import type { GpuGemm } from './gemm.ts';

/** One product: sizes, flags and a storage layout (row padding and offsets, in floats). */
export interface SgemmCase {
  M: number;
  N: number;
  K: number;
  transA?: boolean;
  transB?: boolean;
  accumulate?: boolean;
  bias?: boolean;
  /** floats after each stored row of A, B and C (leading dimension − columns); default 0 */
  pad?: number;
  /** floats before each of A, B, C and the bias; default 0 */
  offset?: number;
}

/** The stored matrices, whole (offsets and padding included). */
export interface SgemmInputs {
  a: Float32Array;
  b: Float32Array;
  /** C before the product: the base when accumulating, and the padding that must survive */
  c: Float32Array;
  bias: Float32Array;
}

/** Leading dimensions and stored sizes of a case. */
export interface SgemmLayout {
  lda: number;
  ldb: number;
  ldc: number;
  offset: number;
  lengthA: number;
  lengthB: number;
  lengthC: number;
  lengthBias: number;
}

export interface SgemmComparison {
  /** max |gpu − wasm| over C */
  maxAbsDiff: number;
  /** max |gpu − wasm| / bound over the M×N window; ≤ 1 passes */
  worstRatio: number;
  /** 2⁻²³·(K+1)·max|a|·max|b|: a coarse scale to report the diffs against */
  scale: number;
  /** elements outside the window that changed on either side */
  paddingChanged: number;
}

const U = 2 ** -24;

/** γ(n) = n·u / (1 − n·u) for float32. */
export function gamma(n: number): number {
  return (n * U) / (1 - n * U);
}

export function sgemmLayout(c: SgemmCase): SgemmLayout {
  const pad = c.pad ?? 0, offset = c.offset ?? 0;
  const [rowsA, colsA] = c.transA ? [c.K, c.M] : [c.M, c.K];
  const [rowsB, colsB] = c.transB ? [c.N, c.K] : [c.K, c.N];
  const lda = colsA + pad, ldb = colsB + pad, ldc = c.N + pad;
  return { lda, ldb, ldc, offset, lengthA: offset + rowsA * lda, lengthB: offset + rowsB * ldb, lengthC: offset + c.M * ldc, lengthBias: offset + c.N };
}

/** Runs the case on the WASM kernels; returns the whole stored C after. */
export function runWasmSgemm(engine: Engine, c: SgemmCase, layout: SgemmLayout, inputs: SgemmInputs): Float32Array {
  const a = engine.tensorFrom([inputs.a.length], inputs.a), b = engine.tensorFrom([inputs.b.length], inputs.b);
  const out = engine.tensorFrom([inputs.c.length], inputs.c), bias = engine.tensorFrom([inputs.bias.length], inputs.bias);
  try {
    const at = (ptr: number): number => ptr + layout.offset * 4;
    engine.kernels.sgemm({
      M: c.M, N: c.N, K: c.K,
      a: at(a.ptr), lda: layout.lda, transA: c.transA,
      b: at(b.ptr), ldb: layout.ldb, transB: c.transB,
      c: at(out.ptr), ldc: layout.ldc,
      accumulate: c.accumulate, bias: c.bias ? at(bias.ptr) : undefined,
    });
    return out.data.slice();
  } finally {
    for (const t of [a, b, out, bias]) engine.free(t);
  }
}

/** Runs the case on the GPU; returns the whole stored C after (a readback). */
export async function runGpuSgemm(device: GPUDevice, gemm: GpuGemm, c: SgemmCase, layout: SgemmLayout, inputs: SgemmInputs): Promise<Float32Array> {
  const a = uploadArray(device, inputs.a), b = uploadArray(device, inputs.b);
  const out = uploadArray(device, inputs.c), bias = uploadArray(device, inputs.bias);
  try {
    const offset = layout.offset;
    gemm.sgemm({
      M: c.M, N: c.N, K: c.K,
      a, aOffset: offset, lda: layout.lda, transA: c.transA,
      b, bOffset: offset, ldb: layout.ldb, transB: c.transB,
      c: out, cOffset: offset, ldc: layout.ldc,
      accumulate: c.accumulate, bias: c.bias ? bias : undefined, biasOffset: offset,
    });
    return await readArray(device, out);
  } finally {
    for (const t of [a, b, out, bias]) t.destroy();
  }
}

/** Inputs for a case, filled by `random` (values in [−1, 1) keep the bound meaningful). */
export function sgemmInputs(layout: SgemmLayout, random: () => number): SgemmInputs {
  const fill = (n: number): Float32Array => Float32Array.from({ length: n }, () => random() * 2 - 1);
  return { a: fill(layout.lengthA), b: fill(layout.lengthB), c: fill(layout.lengthC), bias: fill(layout.lengthBias) };
}

/** Compares two results of `c` (both whole stored C) against the bound. */
export function compareSgemm(c: SgemmCase, layout: SgemmLayout, inputs: SgemmInputs, gpu: Float32Array, wasm: Float32Array): SgemmComparison {
  const { lda, ldb, ldc, offset } = layout;
  const opA = (i: number, k: number): number => inputs.a[offset + (c.transA ? k * lda + i : i * lda + k)];
  const opB = (k: number, j: number): number => inputs.b[offset + (c.transB ? j * ldb + k : k * ldb + j)];
  const g = 2 * gamma(c.K + 1);
  const inWindow = new Uint8Array(layout.lengthC);
  let maxAbsDiff = 0, worstRatio = 0, maxA = 0, maxB = 0, paddingChanged = 0;
  for (let i = 0; i < c.M; i++) {
    for (let j = 0; j < c.N; j++) {
      const o = offset + i * ldc + j;
      inWindow[o] = 1;
      let s = Math.abs(c.accumulate ? inputs.c[o] : c.bias ? inputs.bias[offset + j] : 0);
      for (let k = 0; k < c.K; k++) s += Math.abs(opA(i, k) * opB(k, j));
      const d = Math.abs(gpu[o] - wasm[o]);
      maxAbsDiff = Math.max(maxAbsDiff, d);
      // an exact match passes even where the bound is 0; a NaN fails
      worstRatio = Math.max(worstRatio, d === 0 ? 0 : Number.isNaN(d) ? Infinity : d / (g * s));
    }
  }
  for (let o = 0; o < layout.lengthC; o++) {
    if (!inWindow[o] && (gpu[o] !== inputs.c[o] || wasm[o] !== inputs.c[o])) paddingChanged++;
  }
  for (let x = offset; x < layout.lengthA; x++) maxA = Math.max(maxA, Math.abs(inputs.a[x]));
  for (let x = offset; x < layout.lengthB; x++) maxB = Math.max(maxB, Math.abs(inputs.b[x]));
  return { maxAbsDiff, worstRatio, scale: 2 ** -23 * (c.K + 1) * maxA * maxB, paddingChanged };
}
