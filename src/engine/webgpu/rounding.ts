// Running rounding-error bounds (Higham, Accuracy and Stability of Numerical
// Algorithms, §3.3): a kernel's formula evaluated in float64 on its float32
// inputs, carrying with each value a bound `e` on how far a float32
// evaluation of the same formula can be from it, on either backend. Two
// backends that each stay within e of the float64 value are within 2e of
// each other: that is the bound the GPU kernels are held to against WASM.
//
// Costs per operation, the worse of WGSL's allowed error (WGSL spec, §
// "Floating Point Accuracy") and WASM's (IEEE: correctly rounded), with
// u = 2⁻²⁴ and one ulp of a float32 x at most 2u·|x|:
//   + − ×           correctly rounded on both: u·|result|
//   fma             fused or not (WGSL and Vulkan may do either; so may
//                   relaxed SIMD): u·|a·b| + u·|result|
//   a / b           WGSL 2.5 ulp: 5u·|result|
//   sqrt            WGSL inherits 1 / inverseSqrt: 2 + 2.5 ulp: 9u·|result|
//   inverseSqrt     WGSL 2 ulp: 4u·|result| (WASM 1/√x: 2u)
//   exp             both run the ported Cephes exp (common.wgsl.ts): its
//                   approximation (≈ 2 ulp) plus roundings, fused or not in
//                   its 7 fma: 4 ulp, 8u·|result|
//   log             WGSL: 2⁻²¹ absolute on [0.5, 2], else 3 ulp (6u·|result|)
// Errors of the operands propagate to first order, plus the product term of
// a product. Sums of n terms in any order: γ(d)·Σ|terms| where d is the most
// additions any one term goes through, on either backend.
import { gamma } from './crosscheck.ts';

export const U = 2 ** -24;
const ULP = 2 * U;

/** A value of the formula in float64, and a bound on |float32 evaluation − value|. */
export interface Bounded {
  v: number;
  e: number;
}

/** A float32 input, or a constant both backends hold in the same float32. */
export function exact(v: number): Bounded {
  return { v, e: 0 };
}

export function add(a: Bounded, b: Bounded): Bounded {
  const v = a.v + b.v;
  return { v, e: a.e + b.e + U * Math.abs(v) };
}

export function sub(a: Bounded, b: Bounded): Bounded {
  return add(a, { v: -b.v, e: b.e });
}

export function mul(a: Bounded, b: Bounded): Bounded {
  const v = a.v * b.v;
  return { v, e: Math.abs(a.v) * b.e + Math.abs(b.v) * a.e + a.e * b.e + U * Math.abs(v) };
}

/** a·b + c, fused or not. */
export function fma(a: Bounded, b: Bounded, c: Bounded): Bounded {
  const ab = a.v * b.v, v = ab + c.v;
  return { v, e: Math.abs(a.v) * b.e + Math.abs(b.v) * a.e + a.e * b.e + c.e + U * Math.abs(ab) + U * Math.abs(v) };
}

export function div(a: Bounded, b: Bounded): Bounded {
  const v = a.v / b.v, low = Math.abs(b.v) - b.e;
  if (!(low > 0)) return { v, e: Infinity };
  return { v, e: (a.e + Math.abs(v) * b.e) / low + 2.5 * ULP * Math.abs(v) };
}

export function sqrt(a: Bounded): Bounded {
  const v = Math.sqrt(a.v);
  return { v, e: a.e / (v + Math.sqrt(Math.max(0, a.v - a.e))) + 4.5 * ULP * v };
}

export function inverseSqrt(a: Bounded): Bounded {
  const v = 1 / Math.sqrt(a.v), low = a.v - a.e;
  if (!(low > 0)) return { v, e: Infinity };
  return { v, e: 1 / Math.sqrt(low) - v + 2 * ULP * v };
}

export function exp(a: Bounded): Bounded {
  const v = Math.exp(a.v);
  return { v, e: v * Math.expm1(a.e) + 4 * ULP * v };
}

export function log(a: Bounded): Bounded {
  const v = Math.log(a.v), low = a.v - a.e;
  if (!(low > 0)) return { v, e: Infinity };
  const own = a.v >= 0.5 && a.v <= 2 ? Math.max(2 ** -21, 3 * ULP * Math.abs(v)) : 3 * ULP * Math.abs(v);
  return { v, e: Math.log(a.v / low) + own };
}

/** tanh(x) as both backends compute it: 1 − 2 / (exp(2x) + 1). */
export function tanh(x: Bounded): Bounded {
  const one = exact(1);
  return sub(one, div(exact(2), add(exp(add(x, x)), one)));
}

/** The sum of `terms` in any order in which no term goes through more than `depth` additions. */
export function sum(terms: readonly Bounded[], depth: number = terms.length - 1): Bounded {
  let v = 0, e = 0, abs = 0;
  for (const t of terms) {
    v += t.v;
    e += t.e;
    abs += Math.abs(t.v);
  }
  return { v, e: e + gamma(Math.max(0, depth)) * abs };
}

/**
 * Additions a term of an n-term row sum goes through: in the WASM kernels,
 * n/4 per SIMD lane then 2 to add the lanes (`simd`), or n − 1 in order; on
 * the GPU, ⌈n / wg⌉ − 1 in one invocation then log₂(wg) in the workgroup tree.
 */
export function rowSumDepth(n: number, wg: number, simd: boolean): number {
  const wasm = simd ? Math.ceil(n / 4) + 1 : n - 1;
  const gpu = Math.ceil(n / wg) - 1 + Math.log2(wg);
  return Math.max(wasm, gpu);
}

/** 2e: the bound on |gpu − wasm| when each is within e of the float64 value. */
export function between(b: Bounded): number {
  return 2 * b.e;
}
