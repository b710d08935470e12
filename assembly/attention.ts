// Causal multi-head self-attention over qkv (B×T×3C: q | k | v, head h in
// columns h*hs .. (h+1)*hs of each). Threads split the (batch, head) pairs;
// each pair writes only its own slices, so results do not depend on nt.
// Scratch: per thread, attentionScratchFloats(T, hs) floats.
import { exp4, fma, shareStart } from './simd';

// @ts-ignore: decorator
@inline export function pad4(n: i32): i32 {
  return (n + 3) & ~3;
}

/** Floats of scratch one thread needs. */
export function attentionScratchFloats(T: i32, hs: i32): i32 {
  return hs * pad4(T) + 2 * pad4(T) + 16;
}

/** dst[d][j] = src[j][d] for the head slice: hs × Tp, zero in columns j >= T. */
export function transposeHead(dst: usize, src: usize, T: i32, Tp: i32, hs: i32, stride: i32): void {
  for (let j = 0; j < Tp; j++) {
    for (let d = 0; d < hs; d++) {
      const v: f32 = j < T ? load<f32>(src + ((<usize>j * stride + d) << 2)) : 0;
      store<f32>(dst + ((<usize>d * Tp + j) << 2), v);
    }
  }
}

/**
 * scores[j] = sum_d q[d] * kt[d][j] for j in [0, jEnd) (jEnd multiple of 4).
 */
// @ts-ignore: decorator
@inline export function rowDots(scores: usize, q: usize, kt: usize, hs: i32, Tp: i32, jEnd: i32): void {
  for (let j = 0; j < jEnd; j += 4) {
    let acc = f32x4.splat(0);
    let col = kt + (<usize>j << 2);
    for (let d = 0; d < hs; d++) {
      acc = fma(f32x4.splat(load<f32>(q + (<usize>d << 2))), v128.load(col), acc);
      col += <usize>Tp << 2;
    }
    v128.store(scores + (<usize>j << 2), acc);
  }
}

/**
 * The scaled, masked softmax of one score row in place, without its final
 * normalisation: row[j] = exp(scale·row[j] − max) for j <= i, 0-weight
 * (exp of −inf) beyond, up to jEnd (a multiple of 4). Returns 1 / the sum, by
 * which the caller scales the row. Shared by training (attentionForward) and
 * the KV-cache path (attentionCached), so both sum in the same order.
 */
@inline export function causalSoftmaxRow(row: usize, i: i32, jEnd: i32, scale: f32): f32 {
  let m: f32 = -Infinity;
  for (let j = 0; j <= i; j++) {
    const s = load<f32>(row + (<usize>j << 2)) * scale;
    store<f32>(row + (<usize>j << 2), s);
    m = max(m, s);
  }
  for (let j = i + 1; j < jEnd; j++) store<f32>(row + (<usize>j << 2), -Infinity);
  const mv = f32x4.splat(m);
  let sumv = f32x4.splat(0);
  for (let j = 0; j < jEnd; j += 4) {
    const e = exp4(f32x4.sub(v128.load(row + (<usize>j << 2)), mv));
    v128.store(row + (<usize>j << 2), e);
    sumv = f32x4.add(sumv, e);
  }
  return 1 / ((f32x4.extract_lane(sumv, 0) + f32x4.extract_lane(sumv, 1)) + (f32x4.extract_lane(sumv, 2) + f32x4.extract_lane(sumv, 3)));
}

export function attentionForward(out: usize, att: usize, qkv: usize, B: i32, T: i32, C: i32, NH: i32, scratch: usize, tid: i32, nt: i32): void {
  const hs = C / NH;
  const C3 = C * 3;
  const Tp = pad4(T);
  const scale: f32 = 1 / Mathf.sqrt(<f32>hs);
  const ws = scratch + ((<usize>tid * attentionScratchFloats(T, hs)) << 2);
  const kt = ws;
  const row = kt + ((<usize>hs * Tp) << 2);
  const pairs = B * NH;
  const p0 = shareStart(pairs, tid, nt), p1 = shareStart(pairs, tid + 1, nt);
  for (let p = p0; p < p1; p++) {
    const b = p / NH, h = p % NH;
    const base = qkv + ((<usize>b * T * C3) << 2);
    transposeHead(kt, base + ((<usize>(C + h * hs)) << 2), T, Tp, hs, C3);
    const attBase = att + ((<usize>p * T * T) << 2);
    for (let i = 0; i < T; i++) {
      const q = base + ((<usize>i * C3 + h * hs) << 2);
      const jEnd = pad4(i + 1);
      rowDots(row, q, kt, hs, Tp, jEnd);
      const inv = causalSoftmaxRow(row, i, jEnd, scale);
      const arow = attBase + ((<usize>i * T) << 2);
      for (let j = 0; j < T; j++) {
        store<f32>(arow + (<usize>j << 2), j <= i ? load<f32>(row + (<usize>j << 2)) * inv : 0);
      }
      // out[i, head] = sum_j att[i,j] v[j]
      const o = out + ((<usize>(b * T + i) * C + h * hs) << 2);
      for (let d = 0; d < hs; d += 4) {
        let acc = f32x4.splat(0);
        for (let j = 0; j <= i; j++) {
          const v = base + ((<usize>j * C3 + 2 * C + h * hs + d) << 2);
          acc = fma(f32x4.splat(load<f32>(arow + (<usize>j << 2))), v128.load(v), acc);
        }
        v128.store(o + (<usize>d << 2), acc);
      }
    }
  }
}

export function attentionBackward(dqkv: usize, dout: usize, qkv: usize, att: usize, B: i32, T: i32, C: i32, NH: i32, scratch: usize, tid: i32, nt: i32): void {
  const hs = C / NH;
  const C3 = C * 3;
  const Tp = pad4(T);
  const scale: f32 = 1 / Mathf.sqrt(<f32>hs);
  const ws = scratch + ((<usize>tid * attentionScratchFloats(T, hs)) << 2);
  const vt = ws;
  const datt = vt + ((<usize>hs * Tp) << 2);
  const pairs = B * NH;
  const p0 = shareStart(pairs, tid, nt), p1 = shareStart(pairs, tid + 1, nt);
  for (let p = p0; p < p1; p++) {
    const b = p / NH, h = p % NH;
    const base = qkv + ((<usize>b * T * C3) << 2);
    const dbase = dqkv + ((<usize>b * T * C3) << 2);
    const attBase = att + ((<usize>p * T * T) << 2);
    transposeHead(vt, base + ((<usize>(2 * C + h * hs)) << 2), T, Tp, hs, C3);
    // dk = 0 for this head; it accumulates over i below
    for (let j = 0; j < T; j++) {
      const dk = dbase + ((<usize>j * C3 + C + h * hs) << 2);
      for (let d = 0; d < hs; d += 4) v128.store(dk + (<usize>d << 2), f32x4.splat(0));
    }
    for (let i = 0; i < T; i++) {
      const g = dout + ((<usize>(b * T + i) * C + h * hs) << 2);
      const arow = attBase + ((<usize>i * T) << 2);
      const jEnd = pad4(i + 1);
      // datt[j] = dout[i] · v[j]
      rowDots(datt, g, vt, hs, Tp, jEnd);
      // softmax backward: dpre[j] = att[j] * (datt[j] - sum_k att[k] datt[k]), times scale
      let dot: f32 = 0;
      for (let j = 0; j <= i; j++) dot += load<f32>(arow + (<usize>j << 2)) * load<f32>(datt + (<usize>j << 2));
      for (let j = 0; j <= i; j++) {
        const a = load<f32>(arow + (<usize>j << 2));
        store<f32>(datt + (<usize>j << 2), a * (load<f32>(datt + (<usize>j << 2)) - dot) * scale);
      }
      // dq[i] = sum_j dpre[j] k[j]; dk[j] += dpre[j] q[i]
      const q = base + ((<usize>i * C3 + h * hs) << 2);
      const dq = dbase + ((<usize>i * C3 + h * hs) << 2);
      for (let d = 0; d < hs; d += 4) {
        let acc = f32x4.splat(0);
        for (let j = 0; j <= i; j++) {
          const k = base + ((<usize>j * C3 + C + h * hs + d) << 2);
          acc = fma(f32x4.splat(load<f32>(datt + (<usize>j << 2))), v128.load(k), acc);
        }
        v128.store(dq + (<usize>d << 2), acc);
      }
      for (let j = 0; j <= i; j++) {
        const w = f32x4.splat(load<f32>(datt + (<usize>j << 2)));
        const dk = dbase + ((<usize>j * C3 + C + h * hs) << 2);
        for (let d = 0; d < hs; d += 4) {
          const k = <usize>d << 2;
          v128.store(dk + k, fma(w, v128.load(q + k), v128.load(dk + k)));
        }
      }
    }
    // dv[j] = sum_{i >= j} att[i,j] dout[i]
    for (let j = 0; j < T; j++) {
      const dv = dbase + ((<usize>j * C3 + 2 * C + h * hs) << 2);
      for (let d = 0; d < hs; d += 4) {
        let acc = f32x4.splat(0);
        for (let i = j; i < T; i++) {
          const a = load<f32>(attBase + ((<usize>i * T + j) << 2));
          const g = dout + ((<usize>(b * T + i) * C + h * hs + d) << 2);
          acc = fma(f32x4.splat(a), v128.load(g), acc);
        }
        v128.store(dv + (<usize>d << 2), acc);
      }
    }
  }
}
