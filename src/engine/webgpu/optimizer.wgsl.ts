// The WGSL of the optimizer kernels (src/engine/webgpu/optimizer.ts): AdamW
// as assembly/elementwise.ts computes it, operation by operation, and the
// sum of squares of global-norm clipping, chunked as the WASM kernel is.
import { REDUCE_WGSL } from './common.wgsl.ts';
import type { KernelSpec } from './program.ts';

export const ADAMW_WG = 256;
/** Invocations per NORM_CHUNK chunk of sumSquares: each sums NORM_CHUNK / SUMSQ_WG floats in order, then a tree. */
export const SUMSQ_WG = 256;

export const OPTIMIZER_SPECS = {
  adamw: {
    label: 'adamw',
    workgroupSize: ADAMW_WG,
    uints: ['n'],
    floats: ['lr', 'beta1', 'beta2', 'eps', 'weightDecay', 'bc1', 'bc2', 'gradScale'],
    arrays: [{ name: 'params', write: true }, { name: 'grads' }, { name: 'm', write: true }, { name: 'v', write: true }],
    body: `
  if (gid >= p.n) { return; }
  let i = gid;
  let g = grads(i) * p.gradScale;
  let mi = p.beta1 * m(i) + (1.0 - p.beta1) * g;
  let vi = p.beta2 * v(i) + ((1.0 - p.beta2) * g) * g;
  set_m(i, mi);
  set_v(i, vi);
  let mhat = mi / p.bc1;
  let vhat = vi / p.bc2;
  let w = params(i);
  set_params(i, w - p.lr * (mhat / (sqrt(vhat) + p.eps) + p.weightDecay * w));`,
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
