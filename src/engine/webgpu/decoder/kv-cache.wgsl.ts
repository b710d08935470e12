// The WGSL of the grouped-query KV cache (./decoder.ts): the GPU twins of
// gqaCacheStore and gqaAttentionCached (assembly/attention-gqa.ts), with the
// WASM layout of one layer of a session's cache (keys KV·D × pad4(T)
// channel-major, values T × KV·D) inside one GPU array that holds every
// session's cache. The row table is rows × 2 int32: the session's cache base
// and the row's position, the base in floats from the start of the cache
// array (the WASM table holds a byte address); kOffset and vOffset are in
// floats too.
//
// gqaCacheStore: one invocation per (row, channel of KV·D): copies, so equal
// bits. gqaAttentionCached: one workgroup of CACHED_WG per (row, query head).
// Scores j ≤ pos are strided over the invocations (one dot of D each), then
// the workgroup's max and the sum of exp(s − max) (the WASM exp, trees); the
// exps go to a scratch array (rows × H × T) and one invocation per output
// channel sums Σ_j e_j·v_j in j order, times 1/Σe. The WASM kernel sums the
// exps in 4 lanes and normalises before the weighted sum: other orders, within
// the attention bound (../attention-bound.ts) of the training forward's row.
import { EXP_WGSL, REDUCE_WGSL } from '../common.wgsl.ts';
import { f32, type KernelSpec } from '../program.ts';

/** Invocations per (row, head) of the cached attention (a power of two). */
export const CACHED_WG = 64;
/** Invocations per workgroup of the cache store. */
export const STORE_WG = 256;

export const KV_CACHE_SPECS = {
  gqaCacheStore: {
    label: 'gqaCacheStore',
    workgroupSize: STORE_WG,
    uints: ['rows', 'H', 'KV', 'D', 'T', 'kOffset', 'vOffset'],
    arrays: [{ name: 'cache', write: true }, { name: 'qkv' }, { name: 'table', type: 'i32' }],
    body: `
  let KD = p.KV * p.D;
  if (gid >= p.rows * KD) { return; }
  let r = gid / KD;
  let c = gid % KD;
  let base = u32(table(2u * r));
  let pos = u32(table(2u * r + 1u));
  let Tp = (p.T + 3u) & ~3u;
  let k = r * (p.H + 2u * p.KV) * p.D + p.H * p.D + c;
  set_cache(base + p.kOffset + c * Tp + pos, qkv(k));
  set_cache(base + p.vOffset + pos * KD + c, qkv(k + KD));`,
  },
  gqaAttentionCached: {
    label: 'gqaAttentionCached',
    workgroupSize: CACHED_WG,
    uints: ['rows', 'H', 'KV', 'D', 'T', 'kOffset', 'vOffset'],
    floats: ['scale'],
    arrays: [{ name: 'out', write: true }, { name: 'scores', write: true }, { name: 'cache' }, { name: 'qkv' }, { name: 'table', type: 'i32' }],
    lib: `${REDUCE_WGSL}\n${EXP_WGSL}`,
    body: `
  if (group >= p.rows * p.H) { return; }
  let r = group / p.H;
  let h = group % p.H;
  let g = h / (p.H / p.KV);
  let base = u32(table(2u * r));
  let i = u32(table(2u * r + 1u));
  let Tp = (p.T + 3u) & ~3u;
  let KD = p.KV * p.D;
  let q = r * (p.H + 2u * p.KV) * p.D + h * p.D;
  let kt = base + p.kOffset + g * p.D * Tp;
  let vb = base + p.vOffset + g * p.D;
  let sb = group * p.T;
  var mx = ${f32(-3.4028234663852886e38)};
  for (var j = lid; j <= i; j += WG) {
    var dot = 0.0;
    for (var d = 0u; d < p.D; d++) { dot = fma(qkv(q + d), cache(kt + d * Tp + j), dot); }
    let s = dot * p.scale;
    set_scores(sb + j, s);
    mx = max(mx, s);
  }
  let m = wg_max(lid, mx);
  var l = 0.0;
  for (var j = lid; j <= i; j += WG) {
    let e = exp_cephes(scores(sb + j) - m);
    set_scores(sb + j, e);
    l += e;
  }
  let inv = 1.0 / wg_sum(lid, l);
  storageBarrier();
  for (var d = lid; d < p.D; d += WG) {
    var acc = 0.0;
    for (var j = 0u; j <= i; j++) { acc = fma(scores(sb + j), cache(vb + j * KD + d), acc); }
    set_out(r * p.H * p.D + h * p.D + d, acc * inv);
  }`,
  },
} satisfies Record<string, KernelSpec>;
