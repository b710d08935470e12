// WGSL shared by several kernels: the WASM kernels' exp (assembly/simd.ts,
// exp4), ported operation by operation so that both backends evaluate the
// same approximation (WGSL's own exp may be off by 3 + 2·|x| ulps and differs
// between GPUs), and workgroup reductions.
import { f32 } from './program.ts';

/**
 * exp(x), Cephes-style as assembly/simd.ts: x = n·ln2 + r, a degree-6
 * polynomial for exp(r), then 2ⁿ through the exponent bits. Same constants
 * (rounded to float32 as AssemblyScript rounds them), same clamping.
 */
export const EXP_WGSL = /* wgsl */ `
fn exp_cephes(x0: f32) -> f32 {
  let x = max(min(x0, ${f32(88.3762626647949)}), ${f32(-87.3365478515625)});
  let fx = floor(fma(x, ${f32(1.4426950408889634)}, 0.5));
  var r = x - fx * ${f32(0.693359375)};
  r = r - fx * ${f32(-2.12194440e-4)};
  let r2 = r * r;
  var y = ${f32(1.9875691500e-4)};
  y = fma(y, r, ${f32(1.3981999507e-3)});
  y = fma(y, r, ${f32(8.3334519073e-3)});
  y = fma(y, r, ${f32(4.1665795894e-2)});
  y = fma(y, r, ${f32(1.6666665459e-1)});
  y = fma(y, r, ${f32(5.0000001201e-1)});
  y = fma(y, r2, r);
  y = y + 1.0;
  return y * bitcast<f32>((i32(fx) + 127) << 23u);
}
`;

/**
 * Sum and max over a workgroup of WG invocations (WG a power of two), in a
 * fixed tree order. Every invocation must call them, in uniform control
 * flow. Each writes its own cell before the first barrier, so no cell is read
 * unwritten; the last barrier lets the next call reuse the cells.
 */
export const REDUCE_WGSL = /* wgsl */ `
var<workgroup> red: array<f32, WG>;
${reducer('wg_sum', (a: string, b: string): string => `${a} + ${b}`)}
${reducer('wg_max', (a: string, b: string): string => `max(${a}, ${b})`)}
`;

function reducer(name: string, combine: (a: string, b: string) => string): string {
  return /* wgsl */ `
fn ${name}(lid: u32, v: f32) -> f32 {
  red[lid] = v;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s = s / 2u) {
    if (lid < s) { red[lid] = ${combine('red[lid]', 'red[lid + s]')}; }
    workgroupBarrier();
  }
  let total = red[0];
  workgroupBarrier();
  return total;
}`;
}
