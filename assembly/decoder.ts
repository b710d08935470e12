// Kernels of the Llama-family decoders (Llama, Mistral, Qwen2): RMSNorm,
// rotary position embeddings (RoPE) and the SwiGLU gate. Forward passes and
// input gradients split rows (or elements) across threads; the RMSNorm weight
// gradient splits columns, so every gradient element is summed over rows in
// the same order for any thread count. Any row length works (scalar tails).
import { exp4, fma, hsum, shareStart } from './simd';

// @ts-ignore: decorator
@inline function rowPtr(base: usize, row: i32, C: i32): usize {
  return base + ((<usize>row * C) << 2);
}

/** Column range start for thread tid, in whole vectors of 4 columns. */
// @ts-ignore: decorator
@inline function colStart(C: i32, tid: i32, nt: i32): i32 {
  const vecs = (C + 3) >> 2;
  return min(C, shareStart(vecs, tid, nt) << 2);
}

// ---- RMSNorm ----------------------------------------------------------------

/** Σ x[c]² over one row: four lanes, then the scalar tail, in a fixed order. */
// @ts-ignore: decorator
@inline function sumSquaresRow(x: usize, C: i32): f32 {
  let acc = f32x4.splat(0);
  let c = 0;
  for (; c + 4 <= C; c += 4) {
    const v = v128.load(x + (<usize>c << 2));
    acc = fma(v, v, acc);
  }
  let s = hsum(acc);
  for (; c < C; c++) {
    const v = load<f32>(x + (<usize>c << 2));
    s += v * v;
  }
  return s;
}

/** out = inp · rstd · weight per row, rstd = 1 / √(mean(inp²) + eps); saves rstd (N floats). */
export function rmsnormForward(out: usize, rstd: usize, inp: usize, weight: usize, eps: f32, N: i32, C: i32, tid: i32, nt: i32): void {
  const r0 = shareStart(N, tid, nt), r1 = shareStart(N, tid + 1, nt);
  const invC: f32 = 1 / <f32>C;
  for (let r = r0; r < r1; r++) {
    const x = rowPtr(inp, r, C), o = rowPtr(out, r, C);
    const s: f32 = 1 / Mathf.sqrt(sumSquaresRow(x, C) * invC + eps);
    const sv = f32x4.splat(s);
    let c = 0;
    for (; c + 4 <= C; c += 4) {
      const k = <usize>c << 2;
      v128.store(o + k, f32x4.mul(f32x4.mul(v128.load(x + k), sv), v128.load(weight + k)));
    }
    for (; c < C; c++) {
      const k = <usize>c << 2;
      store<f32>(o + k, (load<f32>(x + k) * s) * load<f32>(weight + k));
    }
    store<f32>(rstd + (<usize>r << 2), s);
  }
}

/**
 * dinp += RMSNorm input gradient, per row:
 * dinp = rstd · (g − xhat · mean(g · xhat)), g = dout · weight, xhat = inp · rstd.
 */
export function rmsnormBackwardInput(dinp: usize, dout: usize, inp: usize, weight: usize, rstd: usize, N: i32, C: i32, tid: i32, nt: i32): void {
  const r0 = shareStart(N, tid, nt), r1 = shareStart(N, tid + 1, nt);
  const invC: f32 = 1 / <f32>C;
  for (let r = r0; r < r1; r++) {
    const x = rowPtr(inp, r, C), d = rowPtr(dout, r, C), di = rowPtr(dinp, r, C);
    const s = load<f32>(rstd + (<usize>r << 2));
    const sv = f32x4.splat(s);
    let acc = f32x4.splat(0);
    let c = 0;
    for (; c + 4 <= C; c += 4) {
      const k = <usize>c << 2;
      const xhat = f32x4.mul(v128.load(x + k), sv);
      acc = fma(f32x4.mul(v128.load(d + k), v128.load(weight + k)), xhat, acc);
    }
    let dot = hsum(acc);
    for (; c < C; c++) {
      const k = <usize>c << 2;
      dot += (load<f32>(d + k) * load<f32>(weight + k)) * (load<f32>(x + k) * s);
    }
    const m: f32 = dot * invC;
    const mv = f32x4.splat(m);
    c = 0;
    for (; c + 4 <= C; c += 4) {
      const k = <usize>c << 2;
      const xhat = f32x4.mul(v128.load(x + k), sv);
      const g = f32x4.mul(v128.load(d + k), v128.load(weight + k));
      const gi = f32x4.mul(f32x4.sub(g, f32x4.mul(xhat, mv)), sv);
      v128.store(di + k, f32x4.add(v128.load(di + k), gi));
    }
    for (; c < C; c++) {
      const k = <usize>c << 2;
      const xhat = load<f32>(x + k) * s;
      const g = load<f32>(d + k) * load<f32>(weight + k);
      store<f32>(di + k, load<f32>(di + k) + (g - xhat * m) * s);
    }
  }
}

/** dweight += Σ over rows of dout · inp · rstd. Threads split columns. */
export function rmsnormBackwardParams(dweight: usize, dout: usize, inp: usize, rstd: usize, N: i32, C: i32, tid: i32, nt: i32): void {
  const c0 = colStart(C, tid, nt), c1 = colStart(C, tid + 1, nt);
  let c = c0;
  for (; c + 4 <= c1; c += 4) {
    const k = <usize>c << 2;
    let gw = f32x4.splat(0);
    for (let r = 0; r < N; r++) {
      const sv = f32x4.splat(load<f32>(rstd + (<usize>r << 2)));
      const xhat = f32x4.mul(v128.load(rowPtr(inp, r, C) + k), sv);
      gw = fma(v128.load(rowPtr(dout, r, C) + k), xhat, gw);
    }
    v128.store(dweight + k, f32x4.add(v128.load(dweight + k), gw));
  }
  for (; c < c1; c++) {
    const k = <usize>c << 2;
    let gw: f32 = 0;
    for (let r = 0; r < N; r++) {
      const xhat = load<f32>(rowPtr(inp, r, C) + k) * load<f32>(rstd + (<usize>r << 2));
      gw += load<f32>(rowPtr(dout, r, C) + k) * xhat;
    }
    store<f32>(dweight + k, load<f32>(dweight + k) + gw);
  }
}

// ---- rotary position embeddings -----------------------------------------------

/**
 * Rotates `heads` heads of `headDim` floats at the start of each of `rows`
 * rows (row stride `stride` floats) by the angles of the row's position, in
 * Hugging Face's rotate_half convention: element i of a head pairs with
 * element i + headDim/2, and the pair turns by pos · invFreq[i]:
 *   out[i]        = x[i] · cos − x[i + half] · sin
 *   out[i + half] = x[i + half] · cos + x[i] · sin
 * `sign` −1 turns the other way (the transpose: the backward pass). The
 * position of row r is the int32 at positions + 4·r·posStride. `table` holds,
 * per position p, headDim floats: cos(p·invFreq[0..half)) then sin(…).
 * out may be inp (in place). Threads split rows.
 */
// @ts-ignore: decorator
@inline function rotate(
  out: usize, inp: usize, rows: i32, heads: i32, headDim: i32, stride: i32, positions: usize, posStride: i32, table: usize,
  sign: f32, tid: i32, nt: i32,
): void {
  const half = headDim >> 1;
  const r0 = shareStart(rows, tid, nt), r1 = shareStart(rows, tid + 1, nt);
  const signv = f32x4.splat(sign);
  for (let r = r0; r < r1; r++) {
    const pos = load<i32>(positions + ((<usize>r * posStride) << 2));
    const cs = table + ((<usize>pos * headDim) << 2);
    const sn = cs + (<usize>half << 2);
    for (let h = 0; h < heads; h++) {
      const x = inp + ((<usize>r * stride + h * headDim) << 2);
      const o = out + ((<usize>r * stride + h * headDim) << 2);
      let i = 0;
      for (; i + 4 <= half; i += 4) {
        const k = <usize>i << 2, k2 = <usize>(i + half) << 2;
        const c = v128.load(cs + k), s = f32x4.mul(v128.load(sn + k), signv);
        const x1 = v128.load(x + k), x2 = v128.load(x + k2);
        v128.store(o + k, f32x4.sub(f32x4.mul(x1, c), f32x4.mul(x2, s)));
        v128.store(o + k2, f32x4.add(f32x4.mul(x2, c), f32x4.mul(x1, s)));
      }
      for (; i < half; i++) {
        const k = <usize>i << 2, k2 = <usize>(i + half) << 2;
        const c = load<f32>(cs + k), s = load<f32>(sn + k) * sign;
        const x1 = load<f32>(x + k), x2 = load<f32>(x + k2);
        store<f32>(o + k, x1 * c - x2 * s);
        store<f32>(o + k2, x2 * c + x1 * s);
      }
    }
  }
}

/** out = RoPE(inp) (see rotate); out may be inp. */
export function ropeForward(
  out: usize, inp: usize, rows: i32, heads: i32, headDim: i32, stride: i32, positions: usize, posStride: i32, table: usize, tid: i32, nt: i32,
): void {
  rotate(out, inp, rows, heads, headDim, stride, positions, posStride, table, 1, tid, nt);
}

/** dinp = the inverse rotation of dout (written; dinp may be dout). */
export function ropeBackward(
  dinp: usize, dout: usize, rows: i32, heads: i32, headDim: i32, stride: i32, positions: usize, posStride: i32, table: usize, tid: i32, nt: i32,
): void {
  rotate(dinp, dout, rows, heads, headDim, stride, positions, posStride, table, -1, tid, nt);
}

// ---- SwiGLU -----------------------------------------------------------------

/** σ(x) = 1 / (1 + e^−x), four lanes. */
// @ts-ignore: decorator
@inline function sigmoid4(x: v128): v128 {
  return f32x4.div(f32x4.splat(1), f32x4.add(f32x4.splat(1), exp4(f32x4.neg(x))));
}

/** Runs of row r's I columns that thread tid takes: the elements of N·I split in whole vectors. */
// @ts-ignore: decorator
@inline function elementStart(n: i32, tid: i32, nt: i32): i32 {
  return min(n, shareStart((n + 3) >> 2, tid, nt) << 2);
}

/**
 * out[r, c] = silu(gate) · up with gate = inp[r, c] and up = inp[r, I + c]:
 * inp is N × 2I (one projection's [gate | up] columns), out N × I. Threads
 * split the N·I outputs.
 */
export function swigluForward(out: usize, inp: usize, N: i32, I: i32, tid: i32, nt: i32): void {
  const n = N * I;
  const s = elementStart(n, tid, nt), e = elementStart(n, tid + 1, nt);
  if (s >= e) return;
  for (let r = s / I; r <= (e - 1) / I; r++) {
    const c0 = max(s - r * I, 0), c1 = min(e - r * I, I);
    const g = rowPtr(inp, r, 2 * I), u = g + (<usize>I << 2), o = rowPtr(out, r, I);
    let c = c0;
    for (; c + 4 <= c1; c += 4) {
      const k = <usize>c << 2;
      const x = v128.load(g + k);
      v128.store(o + k, f32x4.mul(f32x4.mul(x, sigmoid4(x)), v128.load(u + k)));
    }
    for (; c < c1; c++) {
      const k = <usize>c << 2;
      const x = load<f32>(g + k);
      const sg = f32x4.extract_lane(sigmoid4(f32x4.splat(x)), 0);
      store<f32>(o + k, (x * sg) * load<f32>(u + k));
    }
  }
}

/**
 * dinp (N × 2I, written) from dout (N × I): d gate = dout · up · σ(g)(1 + g(1 − σ(g))),
 * d up = dout · silu(g). Threads split the N·I outputs.
 */
export function swigluBackward(dinp: usize, inp: usize, dout: usize, N: i32, I: i32, tid: i32, nt: i32): void {
  const n = N * I;
  const s = elementStart(n, tid, nt), e = elementStart(n, tid + 1, nt);
  if (s >= e) return;
  const one = f32x4.splat(1);
  for (let r = s / I; r <= (e - 1) / I; r++) {
    const c0 = max(s - r * I, 0), c1 = min(e - r * I, I);
    const g = rowPtr(inp, r, 2 * I), u = g + (<usize>I << 2), d = rowPtr(dout, r, I);
    const dg = rowPtr(dinp, r, 2 * I), du = dg + (<usize>I << 2);
    let c = c0;
    for (; c + 4 <= c1; c += 4) {
      const k = <usize>c << 2;
      const x = v128.load(g + k), dy = v128.load(d + k);
      const sg = sigmoid4(x);
      const dsilu = f32x4.mul(sg, fma(x, f32x4.sub(one, sg), one));
      v128.store(dg + k, f32x4.mul(f32x4.mul(dy, v128.load(u + k)), dsilu));
      v128.store(du + k, f32x4.mul(dy, f32x4.mul(x, sg)));
    }
    for (; c < c1; c++) {
      const k = <usize>c << 2;
      const x = load<f32>(g + k), dy = load<f32>(d + k);
      const sg = f32x4.extract_lane(sigmoid4(f32x4.splat(x)), 0);
      const dsilu = f32x4.extract_lane(f32x4.mul(f32x4.splat(sg), fma(f32x4.splat(x), f32x4.splat(1 - sg), one)), 0);
      store<f32>(dg + k, (dy * load<f32>(u + k)) * dsilu);
      store<f32>(du + k, dy * (x * sg));
    }
  }
}
