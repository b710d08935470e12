// The WGSL of the row kernels (src/engine/webgpu/rows.ts), the formulas of
// assembly/rows.ts: layer norm forward and backward, bias gradients, softmax
// cross-entropy. A row's statistics (mean, variance, the two means of the
// layer-norm backward, softmax max and sum) take one workgroup of ROW_WG
// invocations: each sums a strided share of the row, then a tree across the
// workgroup (REDUCE_WGSL); the WASM kernels sum 4 SIMD lanes in order, so the
// two orders differ and the results differ within a rounding bound
// (kernel-bounds.ts). Parameter gradients sum over rows with one invocation
// per column, rows in order, as the WASM kernels do.
import { EXP_WGSL, REDUCE_WGSL } from './common.wgsl.ts';
import { f32, type KernelSpec } from './program.ts';

/** Invocations per row (a power of two). */
export const ROW_WG = 64;
/** Invocations per workgroup of the per-column and per-element kernels. */
export const COLUMN_WG = 64;
export const ELEMENT_WG = 256;
/** The layer-norm epsilon of assembly/rows.ts. */
export const LAYERNORM_EPS = 1e-5;

/** A loop over this invocation's strided share of the row's C columns: `k` = row start + c. */
const eachColumn = (statement: string): string =>
  `  for (var c = lid; c < p.C; c += WG) {\n    let k = row + c;\n    ${statement}\n  }`;

export const ROW_SPECS = {
  layernormForward: {
    label: 'layernormForward',
    workgroupSize: ROW_WG,
    uints: ['N', 'C'],
    floats: ['invC'],
    arrays: [{ name: 'out', write: true }, { name: 'mean', write: true }, { name: 'rstd', write: true }, { name: 'inp' }, { name: 'weight' }, { name: 'bias' }],
    lib: REDUCE_WGSL,
    body: `
  if (group >= p.N) { return; }
  let row = group * p.C;
  var s = 0.0;
${eachColumn('s += inp(k);')}
  let m = wg_sum(lid, s) * p.invC;
  var q = 0.0;
${eachColumn('let d = inp(k) - m; q = fma(d, d, q);')}
  let rs = inverseSqrt(wg_sum(lid, q) * p.invC + ${f32(LAYERNORM_EPS)});
${eachColumn('set_out(k, fma((inp(k) - m) * rs, weight(c), bias(c)));')}
  if (lid == 0u) { set_mean(group, m); set_rstd(group, rs); }`,
  },
  layernormBackwardInput: {
    label: 'layernormBackwardInput',
    workgroupSize: ROW_WG,
    uints: ['N', 'C'],
    floats: ['invC'],
    arrays: [{ name: 'dinp', write: true }, { name: 'dout' }, { name: 'inp' }, { name: 'weight' }, { name: 'mean' }, { name: 'rstd' }],
    lib: REDUCE_WGSL,
    body: `
  if (group >= p.N) { return; }
  let row = group * p.C;
  let m = mean(group);
  let rs = rstd(group);
  var a1 = 0.0;
  var a2 = 0.0;
${eachColumn('let dn = dout(k) * weight(c); a1 += dn; a2 = fma(dn, (inp(k) - m) * rs, a2);')}
  let m1 = wg_sum(lid, a1) * p.invC;
  let m2 = wg_sum(lid, a2) * p.invC;
${eachColumn('let xhat = (inp(k) - m) * rs; let dn = dout(k) * weight(c);\n    set_dinp(k, dinp(k) + ((dn - m1) - xhat * m2) * rs);')}`,
  },
  layernormBackwardWeight: {
    label: 'layernormBackwardWeight',
    workgroupSize: COLUMN_WG,
    uints: ['N', 'C'],
    arrays: [{ name: 'dweight', write: true }, { name: 'dout' }, { name: 'inp' }, { name: 'mean' }, { name: 'rstd' }],
    body: `
  if (gid >= p.C) { return; }
  var acc = 0.0;
  for (var r = 0u; r < p.N; r++) {
    let k = r * p.C + gid;
    acc = fma(dout(k), (inp(k) - mean(r)) * rstd(r), acc);
  }
  set_dweight(gid, dweight(gid) + acc);`,
  },
  biasBackward: {
    label: 'biasBackward',
    workgroupSize: COLUMN_WG,
    uints: ['N', 'C'],
    arrays: [{ name: 'dbias', write: true }, { name: 'dout' }],
    body: `
  if (gid >= p.C) { return; }
  var acc = 0.0;
  for (var r = 0u; r < p.N; r++) { acc += dout(r * p.C + gid); }
  set_dbias(gid, dbias(gid) + acc);`,
  },
  crossEntropyForward: {
    label: 'crossEntropyForward',
    workgroupSize: ROW_WG,
    uints: ['N', 'V'],
    arrays: [{ name: 'losses', write: true }, { name: 'probs', write: true }, { name: 'logits' }, { name: 'targets', type: 'u32' }],
    lib: `${REDUCE_WGSL}\n${EXP_WGSL}`,
    // the max starts at the lowest float, not −∞ as in the WASM kernel (WGSL has no
    // infinite constants): the same unless a whole row is −∞
    body: `
  if (group >= p.N) { return; }
  let row = group * p.V;
  var mx = ${f32(-3.4028234663852886e38)};
  for (var c = lid; c < p.V; c += WG) { mx = max(mx, logits(row + c)); }
  let m = wg_max(lid, mx);
  var s = 0.0;
  for (var c = lid; c < p.V; c += WG) {
    let e = exp_cephes(logits(row + c) - m);
    set_probs(row + c, e);
    s += e;
  }
  let total = wg_sum(lid, s);
  let inv = 1.0 / total;
  for (var c = lid; c < p.V; c += WG) { set_probs(row + c, probs(row + c) * inv); }
  if (lid == 0u) { set_losses(group, log(total) - (logits(row + targets(group)) - m)); }`,
  },
  crossEntropyBackward: {
    label: 'crossEntropyBackward',
    workgroupSize: ELEMENT_WG,
    uints: ['N', 'V'],
    floats: ['scale'],
    arrays: [{ name: 'dlogits', write: true }, { name: 'probs' }, { name: 'targets', type: 'u32' }],
    body: `
  if (gid >= p.N * p.V) { return; }
  let r = gid / p.V;
  var v = probs(gid) * p.scale;
  if (gid - r * p.V == targets(r)) { v = (probs(gid) - 1.0) * p.scale; }
  set_dlogits(gid, v);`,
  },
} satisfies Record<string, KernelSpec>;
