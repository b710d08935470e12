// The WGSL of the Llama-family row and element kernels (./decoder.ts), the
// formulas of assembly/decoder.ts operation by operation: RMSNorm forward and
// backward, rotary embeddings (rotate_half pairs, either direction) and the
// SwiGLU gate. A row's sums (RMSNorm's Σx², its backward's Σ g·x̂) take one
// workgroup of ROW_WG invocations and a tree (REDUCE_WGSL), where the WASM
// kernels sum 4 SIMD lanes then a scalar tail: a different order, so those
// results differ within a rounding bound (./cases.ts). The weight gradient
// sums rows in order with one invocation per column, as the WASM kernel does.
// σ(x) uses the WASM kernels' exp (EXP_WGSL).
import { EXP_WGSL, REDUCE_WGSL } from '../common.wgsl.ts';
import type { KernelSpec } from '../program.ts';
import { COLUMN_WG, ELEMENT_WG, ROW_WG } from '../rows.wgsl.ts';

export { COLUMN_WG, ELEMENT_WG, ROW_WG };

/** A loop over this invocation's strided share of the row's C columns: `k` = row start + c. */
const eachColumn = (statement: string): string =>
  `  for (var c = lid; c < p.C; c += WG) {\n    let k = row + c;\n    ${statement}\n  }`;

/** σ(x) = 1 / (1 + e^−x), as assembly/decoder.ts's sigmoid4. */
const SIGMOID_WGSL = /* wgsl */ `
${EXP_WGSL}
fn sigmoid(x: f32) -> f32 { return 1.0 / (1.0 + exp_cephes(-x)); }
`;

/**
 * RoPE on one (row, head, pair) per invocation: i and i + half of head h of
 * row r, turned by the row's position; `sign` −1 turns back (the backward).
 * `read` and `write` name the accessors (in place: one read_write array).
 */
function ropeBody(read: string, write: string): string {
  return `
  let half = p.D / 2u;
  let perRow = p.heads * half;
  if (gid >= p.rows * perRow) { return; }
  let r = gid / perRow;
  let h = (gid % perRow) / half;
  let i = gid % half;
  let pos = u32(positions(r * p.posStride));
  let c = table(pos * p.D + i);
  let s = table(pos * p.D + half + i) * p.sign;
  let k = r * p.stride + h * p.D + i;
  let x1 = ${read}(k);
  let x2 = ${read}(k + half);
  ${write}(k, x1 * c - x2 * s);
  ${write}(k + half, x2 * c + x1 * s);`;
}

export const DECODER_SPECS = {
  rmsnormForward: {
    label: 'rmsnormForward',
    workgroupSize: ROW_WG,
    uints: ['N', 'C'],
    floats: ['invC', 'eps'],
    arrays: [{ name: 'out', write: true }, { name: 'rstd', write: true }, { name: 'inp' }, { name: 'weight' }],
    lib: REDUCE_WGSL,
    body: `
  if (group >= p.N) { return; }
  let row = group * p.C;
  var q = 0.0;
${eachColumn('let x = inp(k); q = fma(x, x, q);')}
  let rs = inverseSqrt(wg_sum(lid, q) * p.invC + p.eps);
${eachColumn('set_out(k, (inp(k) * rs) * weight(c));')}
  if (lid == 0u) { set_rstd(group, rs); }`,
  },
  rmsnormBackwardInput: {
    label: 'rmsnormBackwardInput',
    workgroupSize: ROW_WG,
    uints: ['N', 'C'],
    floats: ['invC'],
    arrays: [{ name: 'dinp', write: true }, { name: 'dout' }, { name: 'inp' }, { name: 'weight' }, { name: 'rstd' }],
    lib: REDUCE_WGSL,
    body: `
  if (group >= p.N) { return; }
  let row = group * p.C;
  let rs = rstd(group);
  var a = 0.0;
${eachColumn('a = fma(dout(k) * weight(c), inp(k) * rs, a);')}
  let m = wg_sum(lid, a) * p.invC;
${eachColumn('let g = dout(k) * weight(c); let xhat = inp(k) * rs;\n    set_dinp(k, dinp(k) + (g - xhat * m) * rs);')}`,
  },
  rmsnormBackwardParams: {
    label: 'rmsnormBackwardParams',
    workgroupSize: COLUMN_WG,
    uints: ['N', 'C'],
    arrays: [{ name: 'dweight', write: true }, { name: 'dout' }, { name: 'inp' }, { name: 'rstd' }],
    body: `
  if (gid >= p.C) { return; }
  var acc = 0.0;
  for (var r = 0u; r < p.N; r++) {
    let k = r * p.C + gid;
    acc = fma(dout(k), inp(k) * rstd(r), acc);
  }
  set_dweight(gid, dweight(gid) + acc);`,
  },
  rope: {
    label: 'rope',
    workgroupSize: ELEMENT_WG,
    uints: ['rows', 'heads', 'D', 'stride', 'posStride'],
    floats: ['sign'],
    arrays: [{ name: 'out', write: true }, { name: 'inp' }, { name: 'positions', type: 'i32' }, { name: 'table' }],
    body: ropeBody('inp', 'set_out'),
  },
  ropeInPlace: {
    label: 'ropeInPlace',
    workgroupSize: ELEMENT_WG,
    uints: ['rows', 'heads', 'D', 'stride', 'posStride'],
    floats: ['sign'],
    arrays: [{ name: 'x', write: true }, { name: 'positions', type: 'i32' }, { name: 'table' }],
    body: ropeBody('x', 'set_x'),
  },
  swigluForward: {
    label: 'swigluForward',
    workgroupSize: ELEMENT_WG,
    uints: ['N', 'I'],
    arrays: [{ name: 'out', write: true }, { name: 'inp' }],
    lib: SIGMOID_WGSL,
    body: `
  if (gid >= p.N * p.I) { return; }
  let r = gid / p.I;
  let g = r * 2u * p.I + gid % p.I;
  let x = inp(g);
  set_out(gid, (x * sigmoid(x)) * inp(g + p.I));`,
  },
  swigluBackward: {
    label: 'swigluBackward',
    workgroupSize: ELEMENT_WG,
    uints: ['N', 'I'],
    arrays: [{ name: 'dinp', write: true }, { name: 'inp' }, { name: 'dout' }],
    lib: SIGMOID_WGSL,
    body: `
  if (gid >= p.N * p.I) { return; }
  let r = gid / p.I;
  let g = r * 2u * p.I + gid % p.I;
  let x = inp(g);
  let dy = dout(gid);
  let sg = sigmoid(x);
  let dsilu = sg * fma(x, 1.0 - sg, 1.0);
  set_dinp(g, (dy * inp(g + p.I)) * dsilu);
  set_dinp(g + p.I, dy * (x * sg));`,
  },
} satisfies Record<string, KernelSpec>;
