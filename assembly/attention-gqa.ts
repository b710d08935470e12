// Grouped-query causal self-attention (Llama, Mistral, Qwen2; multi-head
// attention is the case kvHeads = heads), for training and over a KV cache.
//
// Layout: one fused projection gives qkv, B·T rows of (H + 2·KV)·D floats
// (H = heads, KV = kvHeads, D = headDim, a multiple of 4):
//   q head h at columns h·D, k head g at (H + g)·D, v head g at (H + KV + g)·D.
// Query head h reads kv head g = h / (H / KV) (Hugging Face's repeat_kv).
// out is B·T rows of H·D floats; att (B × H × T × T) keeps the probabilities.
// Scale 1/√D. Scratch per thread: attentionScratchFloats(T, D).
//
// Threads: forward splits the (batch, query head) pairs; backward splits the
// (batch, kv head) pairs, each summing dk and dv over its query heads in
// order; the cached kernels split rows or (row, head) pairs. No sum depends on
// the thread count. Every sum runs in the order attentionForward
// (./attention.ts) runs it, so the cached path reproduces the training
// forward bit for bit.
import { attentionScratchFloats, causalSoftmaxRow, pad4, rowDots, transposeHead } from './attention';
import { fma, shareStart } from './simd';

/** out[i, head] = Σ_{j ≤ i} p[j] · v[j] (D floats, v rows `vStride` floats apart). */
// @ts-ignore: decorator
@inline function weightedValues(o: usize, p: usize, v: usize, i: i32, D: i32, vStride: i32): void {
  for (let d = 0; d < D; d += 4) {
    let acc = f32x4.splat(0);
    for (let j = 0; j <= i; j++) {
      acc = fma(f32x4.splat(load<f32>(p + (<usize>j << 2))), v128.load(v + ((<usize>j * vStride + d) << 2)), acc);
    }
    v128.store(o + (<usize>d << 2), acc);
  }
}

export function gqaAttentionForward(
  out: usize, att: usize, qkv: usize, B: i32, T: i32, H: i32, KV: i32, D: i32, scratch: usize, tid: i32, nt: i32,
): void {
  const W = (H + 2 * KV) * D, OW = H * D, rep = H / KV;
  const Tp = pad4(T);
  const scale: f32 = 1 / Mathf.sqrt(<f32>D);
  const kt = scratch + ((<usize>tid * attentionScratchFloats(T, D)) << 2);
  const row = kt + ((<usize>D * Tp) << 2);
  const pairs = B * H;
  const p0 = shareStart(pairs, tid, nt), p1 = shareStart(pairs, tid + 1, nt);
  for (let p = p0; p < p1; p++) {
    const b = p / H, h = p % H, g = h / rep;
    const base = qkv + ((<usize>b * T * W) << 2);
    transposeHead(kt, base + (<usize>((H + g) * D) << 2), T, Tp, D, W);
    const v = base + (<usize>((H + KV + g) * D) << 2);
    const attBase = att + ((<usize>p * T * T) << 2);
    for (let i = 0; i < T; i++) {
      const q = base + ((<usize>i * W + h * D) << 2);
      const jEnd = pad4(i + 1);
      rowDots(row, q, kt, D, Tp, jEnd);
      const inv = causalSoftmaxRow(row, i, jEnd, scale);
      const arow = attBase + ((<usize>i * T) << 2);
      for (let j = 0; j < T; j++) {
        store<f32>(arow + (<usize>j << 2), j <= i ? load<f32>(row + (<usize>j << 2)) * inv : 0);
      }
      weightedValues(out + ((<usize>(b * T + i) * OW + h * D) << 2), arow, v, i, D, W);
    }
  }
}

/** dqkv (B·T × (H + 2KV)·D) = the gradient of gqaAttentionForward: q, k and v parts all written. */
export function gqaAttentionBackward(
  dqkv: usize, dout: usize, qkv: usize, att: usize, B: i32, T: i32, H: i32, KV: i32, D: i32, scratch: usize, tid: i32, nt: i32,
): void {
  const W = (H + 2 * KV) * D, OW = H * D, rep = H / KV;
  const Tp = pad4(T);
  const scale: f32 = 1 / Mathf.sqrt(<f32>D);
  const vt = scratch + ((<usize>tid * attentionScratchFloats(T, D)) << 2);
  const datt = vt + ((<usize>D * Tp) << 2);
  const pairs = B * KV;
  const p0 = shareStart(pairs, tid, nt), p1 = shareStart(pairs, tid + 1, nt);
  for (let p = p0; p < p1; p++) {
    const b = p / KV, g = p % KV;
    const base = qkv + ((<usize>b * T * W) << 2);
    const dbase = dqkv + ((<usize>b * T * W) << 2);
    const kOff = (H + g) * D, vOff = (H + KV + g) * D;
    transposeHead(vt, base + (<usize>vOff << 2), T, Tp, D, W);
    // dk and dv of this kv head accumulate over its query heads below
    for (let j = 0; j < T; j++) {
      const dk = dbase + ((<usize>j * W + kOff) << 2), dv = dbase + ((<usize>j * W + vOff) << 2);
      for (let d = 0; d < D; d += 4) {
        v128.store(dk + (<usize>d << 2), f32x4.splat(0));
        v128.store(dv + (<usize>d << 2), f32x4.splat(0));
      }
    }
    for (let h = g * rep; h < (g + 1) * rep; h++) {
      const attBase = att + ((<usize>(b * H + h) * T * T) << 2);
      for (let i = 0; i < T; i++) {
        const gr = dout + ((<usize>(b * T + i) * OW + h * D) << 2);
        const arow = attBase + ((<usize>i * T) << 2);
        const jEnd = pad4(i + 1);
        // datt[j] = dout[i] · v[j]; softmax backward: dpre[j] = att[j] (datt[j] − Σ_k att[k] datt[k]) · scale
        rowDots(datt, gr, vt, D, Tp, jEnd);
        let dot: f32 = 0;
        for (let j = 0; j <= i; j++) dot += load<f32>(arow + (<usize>j << 2)) * load<f32>(datt + (<usize>j << 2));
        for (let j = 0; j <= i; j++) {
          const a = load<f32>(arow + (<usize>j << 2));
          store<f32>(datt + (<usize>j << 2), a * (load<f32>(datt + (<usize>j << 2)) - dot) * scale);
        }
        // dq[i] = Σ_j dpre[j] k[j] (written); dk[j] += dpre[j] q[i]
        const q = base + ((<usize>i * W + h * D) << 2);
        weightedValues(dbase + ((<usize>i * W + h * D) << 2), datt, base + (<usize>kOff << 2), i, D, W);
        for (let j = 0; j <= i; j++) {
          const w = f32x4.splat(load<f32>(datt + (<usize>j << 2)));
          const dk = dbase + ((<usize>j * W + kOff) << 2);
          for (let d = 0; d < D; d += 4) {
            const k = <usize>d << 2;
            v128.store(dk + k, fma(w, v128.load(q + k), v128.load(dk + k)));
          }
        }
      }
      // dv[j] += Σ_{i ≥ j} att[i, j] dout[i]
      for (let j = 0; j < T; j++) {
        const dv = dbase + ((<usize>j * W + vOff) << 2);
        for (let d = 0; d < D; d += 4) {
          let acc = f32x4.splat(0);
          for (let i = j; i < T; i++) {
            const a = load<f32>(attBase + ((<usize>i * T + j) << 2));
            acc = fma(f32x4.splat(a), v128.load(dout + ((<usize>(b * T + i) * OW + h * D + d) << 2)), acc);
          }
          v128.store(dv + (<usize>d << 2), f32x4.add(v128.load(dv + (<usize>d << 2)), acc));
        }
      }
    }
  }
}

// ---- over a KV cache (inference) ---------------------------------------------
//
// A session's cache, for one layer, holds KV·D key and value channels:
//   K: KV·D × Tp floats, channel-major (kt[c][j]: key j, channel c), so kv
//      head g is the D × Tp slice the training kernel transposes keys to;
//   V: T × KV·D floats, row-major.
// The row table (rows × 2 int32: the session's cache base, the row's position)
// is the one kvCacheStore / attentionCached take (./attention-cached.ts). Keys
// are stored as they are in qkv: apply RoPE to the rows first.

/** Writes the keys and values of `rows` qkv rows ((H + 2KV)·D floats each) into their sessions' caches at their positions. Threads split rows. */
export function gqaCacheStore(
  qkv: usize, table: usize, rows: i32, kOffset: i32, vOffset: i32, H: i32, KV: i32, D: i32, T: i32, tid: i32, nt: i32,
): void {
  const W = (H + 2 * KV) * D, KD = KV * D;
  const Tp = pad4(T);
  const r0 = shareStart(rows, tid, nt), r1 = shareStart(rows, tid + 1, nt);
  for (let r = r0; r < r1; r++) {
    const base = <usize>load<u32>(table + (<usize>r << 3));
    const pos = load<i32>(table + (<usize>r << 3), 4);
    const ks = qkv + ((<usize>r * W + H * D) << 2);
    const kt = base + <usize>kOffset;
    for (let c = 0; c < KD; c++) store<f32>(kt + ((<usize>c * Tp + pos) << 2), load<f32>(ks + (<usize>c << 2)));
    const vs = ks + (<usize>KD << 2);
    const v = base + <usize>vOffset + ((<usize>pos * KD) << 2);
    for (let c = 0; c < KD; c += 4) v128.store(v + (<usize>c << 2), v128.load(vs + (<usize>c << 2)));
  }
}

/**
 * out (rows × H·D) = causal attention of each row's query heads (in qkv)
 * over its session's cached keys and values at positions 0..pos. Threads
 * split the (row, query head) pairs.
 */
export function gqaAttentionCached(
  out: usize, qkv: usize, table: usize, rows: i32, kOffset: i32, vOffset: i32, H: i32, KV: i32, D: i32, T: i32, scratch: usize, tid: i32, nt: i32,
): void {
  const W = (H + 2 * KV) * D, KD = KV * D, rep = H / KV;
  const Tp = pad4(T);
  const scale: f32 = 1 / Mathf.sqrt(<f32>D);
  const row = scratch + ((<usize>tid * attentionScratchFloats(T, D)) << 2);
  const pairs = rows * H;
  const p0 = shareStart(pairs, tid, nt), p1 = shareStart(pairs, tid + 1, nt);
  for (let p = p0; p < p1; p++) {
    const r = p / H, h = p % H, g = h / rep;
    const base = <usize>load<u32>(table + (<usize>r << 3));
    const i = load<i32>(table + (<usize>r << 3), 4);
    const q = qkv + ((<usize>r * W + h * D) << 2);
    const kt = base + <usize>kOffset + ((<usize>g * D * Tp) << 2);
    const jEnd = pad4(i + 1);
    rowDots(row, q, kt, D, Tp, jEnd);
    const inv = causalSoftmaxRow(row, i, jEnd, scale);
    for (let j = 0; j <= i; j++) store<f32>(row + (<usize>j << 2), load<f32>(row + (<usize>j << 2)) * inv);
    weightedValues(out + ((<usize>r * H * D + h * D) << 2), row, base + <usize>vOffset + ((<usize>g * D) << 2), i, D, KD);
  }
}
