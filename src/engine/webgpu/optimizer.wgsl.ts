// The WGSL of the optimizer kernels (src/engine/webgpu/optimizer.ts): AdamW
// and its weight prediction as assembly/elementwise.ts computes them,
// operation by operation; the sum of squares of global-norm clipping,
// chunked as the WASM kernel is; and the clipping scale worked out on the GPU
// (clipScale), so a step that clips needs no readback.
import { REDUCE_WGSL } from './common.wgsl.ts';
import type { KernelSpec } from './program.ts';

export const ADAMW_WG = 256;
/** Invocations per NORM_CHUNK chunk of sumSquares: each sums NORM_CHUNK / SUMSQ_WG floats in order, then a tree. */
export const SUMSQ_WG = 256;

const ADAMW_FLOATS = ['lr', 'beta1', 'beta2', 'eps', 'weightDecay', 'bc1', 'bc2'];
const ADAMW_ARRAYS = [{ name: 'params', write: true }, { name: 'grads' }, { name: 'm', write: true }, { name: 'v', write: true }];

/** One AdamW update of element gid (returning early when `skip` holds), each gradient first multiplied by `scale`. */
function adamwBody(skip: string, scale: string): string {
  return `
  if (${skip}) { return; }
  let i = gid;
  let g = grads(i) * ${scale};
  let mi = p.beta1 * m(i) + (1.0 - p.beta1) * g;
  let vi = p.beta2 * v(i) + ((1.0 - p.beta2) * g) * g;
  set_m(i, mi);
  set_v(i, vi);
  let mhat = mi / p.bc1;
  let vhat = vi / p.bc2;
  let w = params(i);
  set_params(i, w - p.lr * (mhat / (sqrt(vhat) + p.eps) + p.weightDecay * w));`;
}

export const OPTIMIZER_SPECS = {
  adamw: {
    label: 'adamw',
    workgroupSize: ADAMW_WG,
    uints: ['n'],
    floats: [...ADAMW_FLOATS, 'gradScale'],
    arrays: ADAMW_ARRAYS,
    body: adamwBody('gid >= p.n', 'p.gradScale'),
  },
  /**
   * AdamW reading its gradient scale from status[0] (clipScale's output)
   * instead of a parameter, and doing nothing when status[3] says the step's
   * gradient norm was not finite: the weights and moments stay as they were.
   */
  adamwScaled: {
    label: 'adamwScaled',
    workgroupSize: ADAMW_WG,
    uints: ['n'],
    floats: ADAMW_FLOATS,
    arrays: [...ADAMW_ARRAYS, { name: 'status' }],
    body: adamwBody('gid >= p.n || status(3) != 0.0', 'status(0)'),
  },
  /** out = params − k · m̂ / (√v̂ + ε), m̂ = m · (1/bc1), v̂ = v · (1/bc2): Kernels.adamPredict */
  adamPredict: {
    label: 'adamPredict',
    workgroupSize: ADAMW_WG,
    uints: ['n'],
    floats: ['k', 'ib1', 'ib2', 'eps'],
    arrays: [{ name: 'out', write: true }, { name: 'params' }, { name: 'm' }, { name: 'v' }],
    body: `
  if (gid >= p.n) { return; }
  let i = gid;
  let mh = m(i) * p.ib1;
  let vh = v(i) * p.ib2;
  set_out(i, params(i) - p.k * (mh / (sqrt(vh) + p.eps)));`,
  },
  /**
   * From sumSquares' chunk partials, by one invocation in chunk order (a
   * compensated sum, close to the WASM engine's float64 one): status[1] =
   * the norm, status[0] = the scale AdamW applies (clip / norm when the norm
   * passes clip > 0, else 1); when the norm is not finite (read from its
   * bits: WGSL may assume no NaN in arithmetic), status[3] = 1 (the step is
   * skipped) and status[2] counts it; else status[3] = 0.
   */
  clipScale: {
    label: 'clipScale',
    workgroupSize: 1,
    uints: ['chunks'],
    floats: ['clip'],
    arrays: [{ name: 'status', write: true }, { name: 'partials' }],
    body: `
  if (gid != 0u) { return; }
  var s = 0.0;
  var c = 0.0;
  for (var i = 0u; i < p.chunks; i++) {
    let y = partials(i) - c;
    let t = s + y;
    c = (t - s) - y;
    s = t;
  }
  let norm = sqrt(s);
  let bad = (bitcast<u32>(norm) & 0x7f800000u) == 0x7f800000u;
  var scale = 1.0;
  if (!bad && p.clip > 0.0 && norm > p.clip) { scale = p.clip / norm; }
  set_status(0u, scale);
  set_status(1u, norm);
  if (bad) {
    set_status(2u, status(2u) + 1.0);
    set_status(3u, 1.0);
  } else {
    set_status(3u, 0.0);
  }`,
  },
  /** partials[c] = Σ x[i]² over chunk c = [c·chunk, (c+1)·chunk) ∩ [0, n), in float32 */
  sumSquares: {
    label: 'sumSquares',
    workgroupSize: SUMSQ_WG,
    uints: ['n', 'chunk'],
    arrays: [{ name: 'partials', write: true }, { name: 'x' }],
    lib: REDUCE_WGSL,
    body: `
  let start = group * p.chunk;
  if (start >= p.n) { return; }
  let end = min(p.n, start + p.chunk);
  var s = 0.0;
  for (var i = start + lid; i < end; i += WG) { let a = x(i); s = fma(a, a, s); }
  let total = wg_sum(lid, s);
  if (lid == 0u) { set_partials(group, total); }`,
  },
} satisfies Record<string, KernelSpec>;
