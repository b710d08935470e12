// Attention over a KV cache, for inference: new rows (a prompt being
// prefilled, or one token per session being decoded) attend over the keys and
// values their session has cached, each at its own position.
//
// A session's cache, for one layer, is two blocks in the engine memory:
//   K: C × Tp floats, channel-major (kt[c][j] = key j, channel c; Tp = T padded
//      to 4), so head h is the hs × Tp slice the training kernel transposes to;
//   V: T × C floats, row-major (v[j][c]).
// A row table (rows × 2 int32: the session's cache base, the row's position)
// says where each row goes. kvCacheStore writes the rows' keys and values into
// their caches first; attentionCached then reads them, so a prompt's row i sees
// rows 0..i of the same call.
//
// Every sum runs in the order attentionForward (./attention.ts) runs it for
// the same query row: scores by rowDots over the same transposed keys, the
// same masked softmax, the same fma chain over values. So the cached path is
// bitwise identical to the full recompute (test/inference/).
import { attentionScratchFloats, causalSoftmaxRow, pad4, rowDots } from './attention';
import { fma, shareStart } from './simd';

/** Writes the key and value of each of `rows` rows of qkv (rows × 3C) into its session's cache at its position. Threads split rows. */
export function kvCacheStore(qkv: usize, table: usize, rows: i32, kOffset: i32, vOffset: i32, C: i32, T: i32, tid: i32, nt: i32): void {
  const Tp = pad4(T);
  const C3 = C * 3;
  const r0 = shareStart(rows, tid, nt), r1 = shareStart(rows, tid + 1, nt);
  for (let r = r0; r < r1; r++) {
    const base = <usize>load<u32>(table + (<usize>r << 3));
    const pos = load<i32>(table + (<usize>r << 3), 4);
    const src = qkv + ((<usize>r * C3) << 2);
    const kt = base + <usize>kOffset;
    for (let c = 0; c < C; c++) {
      store<f32>(kt + ((<usize>c * Tp + pos) << 2), load<f32>(src + (<usize>(C + c) << 2)));
    }
    const v = base + <usize>vOffset + ((<usize>pos * C) << 2);
    const vs = src + (<usize>(2 * C) << 2);
    for (let c = 0; c < C; c += 4) v128.store(v + (<usize>c << 2), v128.load(vs + (<usize>c << 2)));
  }
}

/**
 * out (rows × C) = causal attention of each row's query (in qkv, rows × 3C)
 * over its session's cached keys and values at positions 0..pos. Threads
 * split the (row, head) pairs. Scratch: per thread, attentionScratchFloats(T, hs).
 */
export function attentionCached(
  out: usize, qkv: usize, table: usize, rows: i32, kOffset: i32, vOffset: i32, C: i32, NH: i32, T: i32, scratch: usize, tid: i32, nt: i32,
): void {
  const hs = C / NH;
  const C3 = C * 3;
  const Tp = pad4(T);
  const scale: f32 = 1 / Mathf.sqrt(<f32>hs);
  const row = scratch + ((<usize>tid * attentionScratchFloats(T, hs)) << 2);
  const pairs = rows * NH;
  const p0 = shareStart(pairs, tid, nt), p1 = shareStart(pairs, tid + 1, nt);
  for (let p = p0; p < p1; p++) {
    const r = p / NH, h = p % NH;
    const base = <usize>load<u32>(table + (<usize>r << 3));
    const i = load<i32>(table + (<usize>r << 3), 4);
    const q = qkv + ((<usize>r * C3 + h * hs) << 2);
    const kt = base + <usize>kOffset + ((<usize>h * hs * Tp) << 2);
    const jEnd = pad4(i + 1);
    rowDots(row, q, kt, hs, Tp, jEnd);
    // scaled, masked softmax over j <= i (the same code as attentionForward's)
    const inv = causalSoftmaxRow(row, i, jEnd, scale);
    for (let j = 0; j <= i; j++) store<f32>(row + (<usize>j << 2), load<f32>(row + (<usize>j << 2)) * inv);
    // out[r, head] = sum_j att[j] v[j]
    const o = out + ((<usize>r * C + h * hs) << 2);
    const vbase = base + <usize>vOffset + ((<usize>h * hs) << 2);
    for (let d = 0; d < hs; d += 4) {
      let acc = f32x4.splat(0);
      for (let j = 0; j <= i; j++) {
        const v = vbase + ((<usize>j * C + d) << 2);
        acc = fma(f32x4.splat(load<f32>(row + (<usize>j << 2))), v128.load(v), acc);
      }
      v128.store(o + (<usize>d << 2), acc);
    }
  }
}
