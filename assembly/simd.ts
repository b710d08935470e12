// SIMD helpers shared by every kernel: fused multiply-add (relaxed SIMD when
// the build enables it, mul + add otherwise), a vectorised exp, and the
// thread-partition helper.

/** a * b + c, four lanes. One rounding with relaxed SIMD (FMA), two without. */
// @ts-ignore: decorator
@inline export function fma(a: v128, b: v128, c: v128): v128 {
  if (ASC_FEATURE_RELAXED_SIMD) {
    return f32x4.relaxed_madd(a, b, c);
  } else {
    return f32x4.add(f32x4.mul(a, b), c);
  }
}

/** Sum of the four lanes, in a fixed order. */
// @ts-ignore: decorator
@inline export function hsum(v: v128): f32 {
  return (f32x4.extract_lane(v, 0) + f32x4.extract_lane(v, 1)) +
         (f32x4.extract_lane(v, 2) + f32x4.extract_lane(v, 3));
}

/**
 * exp(x) on four lanes, Cephes-style: x = n ln2 + r, a degree-6 polynomial for
 * exp(r) on [-ln2/2, ln2/2], then scale by 2^n through the exponent bits.
 * Relative error about 2 ulp; inputs are clamped to [-87.3, 88.3].
 */
// @ts-ignore: decorator
@inline export function exp4(x: v128): v128 {
  x = f32x4.min(f32x4.splat(88.3762626647949), x);
  x = f32x4.max(f32x4.splat(-87.3365478515625), x);
  // n = round(x / ln2)
  let fx = fma(x, f32x4.splat(1.44269504088896341), f32x4.splat(0.5));
  fx = f32x4.floor(fx);
  // r = x - n * ln2, in two parts for precision
  let r = f32x4.sub(x, f32x4.mul(fx, f32x4.splat(0.693359375)));
  r = f32x4.sub(r, f32x4.mul(fx, f32x4.splat(-2.12194440e-4)));
  const r2 = f32x4.mul(r, r);
  let y = f32x4.splat(1.9875691500e-4);
  y = fma(y, r, f32x4.splat(1.3981999507e-3));
  y = fma(y, r, f32x4.splat(8.3334519073e-3));
  y = fma(y, r, f32x4.splat(4.1665795894e-2));
  y = fma(y, r, f32x4.splat(1.6666665459e-1));
  y = fma(y, r, f32x4.splat(5.0000001201e-1));
  y = fma(y, r2, r);
  y = f32x4.add(y, f32x4.splat(1.0));
  // 2^n
  const n = i32x4.trunc_sat_f32x4_s(fx);
  const pow2n = i32x4.shl(i32x4.add(n, i32x4.splat(127)), 23);
  return f32x4.mul(y, pow2n);
}

/** Scalar exp with the same algorithm as exp4, so scalar tails match SIMD lanes. */
// @ts-ignore: decorator
@inline export function exp1(x: f32): f32 {
  return f32x4.extract_lane(exp4(f32x4.splat(x)), 0);
}

/** The [start, end) share of `count` items that thread `tid` of `nt` takes. */
// @ts-ignore: decorator
@inline export function shareStart(count: i32, tid: i32, nt: i32): i32 {
  return <i32>((<i64>count * <i64>tid) / <i64>nt);
}
