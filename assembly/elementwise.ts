// Element-wise kernels: residual add, GELU (tanh form), ReLU, AdamW and its
// weight prediction, and the
// chunked sum of squares used for global-norm clipping. Threads split the
// elements into contiguous runs of whole vectors.
import { exp4, fma, shareStart } from './simd';

// @ts-ignore: decorator
@inline function vecRange(n: i32, tid: i32, nt: i32): i64 {
  const vecs = (n + 3) >> 2;
  const s = shareStart(vecs, tid, nt) << 2;
  const e = min(n, shareStart(vecs, tid + 1, nt) << 2);
  return (<i64>s << 32) | <i64>e;
}

/** out = a + b */
export function addForward(out: usize, a: usize, b: usize, n: i32, tid: i32, nt: i32): void {
  const r = vecRange(n, tid, nt);
  const s = <i32>(r >> 32), e = <i32>r;
  let i = s;
  for (; i + 4 <= e; i += 4) {
    const o = <usize>i << 2;
    v128.store(out + o, f32x4.add(v128.load(a + o), v128.load(b + o)));
  }
  for (; i < e; i++) {
    const o = <usize>i << 2;
    store<f32>(out + o, load<f32>(a + o) + load<f32>(b + o));
  }
}

/** dst += src */
export function accumulate(dst: usize, src: usize, n: i32, tid: i32, nt: i32): void {
  addForward(dst, dst, src, n, tid, nt);
}

const GELU_K: f32 = 0.7978845608028654; // sqrt(2/pi)
const GELU_C: f32 = 0.044715;

/** tanh(x) = 1 - 2 / (exp(2x) + 1), four lanes */
// @ts-ignore: decorator
@inline function tanh4(x: v128): v128 {
  const e = exp4(f32x4.add(x, x));
  return f32x4.sub(f32x4.splat(1), f32x4.div(f32x4.splat(2), f32x4.add(e, f32x4.splat(1))));
}

// @ts-ignore: decorator
@inline function gelu4(x: v128): v128 {
  const x3 = f32x4.mul(f32x4.mul(x, x), x);
  const u = f32x4.mul(f32x4.splat(GELU_K), fma(f32x4.splat(GELU_C), x3, x));
  const t = tanh4(u);
  return f32x4.mul(f32x4.mul(f32x4.splat(0.5), x), f32x4.add(f32x4.splat(1), t));
}

// @ts-ignore: decorator
@inline function geluGrad4(x: v128): v128 {
  const x2 = f32x4.mul(x, x);
  const x3 = f32x4.mul(x2, x);
  const u = f32x4.mul(f32x4.splat(GELU_K), fma(f32x4.splat(GELU_C), x3, x));
  const t = tanh4(u);
  const sech2 = f32x4.sub(f32x4.splat(1), f32x4.mul(t, t));
  const du = f32x4.mul(f32x4.splat(GELU_K), fma(f32x4.splat(3 * GELU_C), x2, f32x4.splat(1)));
  // 0.5 (1 + t) + 0.5 x sech² du
  return f32x4.mul(f32x4.splat(0.5), fma(f32x4.mul(x, sech2), du, f32x4.add(f32x4.splat(1), t)));
}

/** out = gelu(inp), tanh approximation */
export function geluForward(out: usize, inp: usize, n: i32, tid: i32, nt: i32): void {
  const r = vecRange(n, tid, nt);
  const s = <i32>(r >> 32), e = <i32>r;
  let i = s;
  for (; i + 4 <= e; i += 4) {
    const o = <usize>i << 2;
    v128.store(out + o, gelu4(v128.load(inp + o)));
  }
  for (; i < e; i++) {
    const o = <usize>i << 2;
    store<f32>(out + o, f32x4.extract_lane(gelu4(f32x4.splat(load<f32>(inp + o))), 0));
  }
}

/** dinp = gelu'(inp) * dout */
export function geluBackward(dinp: usize, inp: usize, dout: usize, n: i32, tid: i32, nt: i32): void {
  const r = vecRange(n, tid, nt);
  const s = <i32>(r >> 32), e = <i32>r;
  let i = s;
  for (; i + 4 <= e; i += 4) {
    const o = <usize>i << 2;
    v128.store(dinp + o, f32x4.mul(geluGrad4(v128.load(inp + o)), v128.load(dout + o)));
  }
  for (; i < e; i++) {
    const o = <usize>i << 2;
    const g = f32x4.extract_lane(geluGrad4(f32x4.splat(load<f32>(inp + o))), 0);
    store<f32>(dinp + o, g * load<f32>(dout + o));
  }
}

/** out = max(inp, 0) */
export function reluForward(out: usize, inp: usize, n: i32, tid: i32, nt: i32): void {
  const r = vecRange(n, tid, nt);
  const s = <i32>(r >> 32), e = <i32>r;
  let i = s;
  for (; i + 4 <= e; i += 4) {
    const o = <usize>i << 2;
    v128.store(out + o, f32x4.max(v128.load(inp + o), f32x4.splat(0)));
  }
  for (; i < e; i++) {
    const o = <usize>i << 2;
    store<f32>(out + o, max<f32>(load<f32>(inp + o), 0));
  }
}

/** dinp = inp > 0 ? dout : 0 */
export function reluBackward(dinp: usize, inp: usize, dout: usize, n: i32, tid: i32, nt: i32): void {
  const r = vecRange(n, tid, nt);
  const s = <i32>(r >> 32), e = <i32>r;
  for (let i = s; i < e; i++) {
    const o = <usize>i << 2;
    store<f32>(dinp + o, load<f32>(inp + o) > 0 ? load<f32>(dout + o) : 0);
  }
}

/**
 * AdamW on n parameters. `bc1`, `bc2` are the bias corrections 1 - beta^t,
 * `gradScale` multiplies every gradient first (global-norm clipping).
 */
export function adamw(
  params: usize, grads: usize, m: usize, v: usize, n: i32,
  lr: f32, beta1: f32, beta2: f32, eps: f32, weightDecay: f32, bc1: f32, bc2: f32, gradScale: f32,
  tid: i32, nt: i32,
): void {
  const r = vecRange(n, tid, nt);
  const s = <i32>(r >> 32), e = <i32>r;
  for (let i = s; i < e; i++) {
    const o = <usize>i << 2;
    const g = load<f32>(grads + o) * gradScale;
    const mi = beta1 * load<f32>(m + o) + (1 - beta1) * g;
    const vi = beta2 * load<f32>(v + o) + (1 - beta2) * g * g;
    store<f32>(m + o, mi);
    store<f32>(v + o, vi);
    const mhat = mi / bc1;
    const vhat = vi / bc2;
    const p = load<f32>(params + o);
    store<f32>(params + o, p - lr * (mhat / (Mathf.sqrt(vhat) + eps) + weightDecay * p));
  }
}

/**
 * Weight prediction: out = params − k · (m / bc1) / (√(v / bc2) + eps), where
 * k = steps · lr: where AdamW's next `steps` updates take the weights if the
 * moments stay as they are. `out` may be `params`.
 */
export function adamPredict(
  out: usize, params: usize, m: usize, v: usize, n: i32,
  k: f32, bc1: f32, bc2: f32, eps: f32,
  tid: i32, nt: i32,
): void {
  const r = vecRange(n, tid, nt);
  const s = <i32>(r >> 32), e = <i32>r;
  const kv = f32x4.splat(k), ib1 = f32x4.splat(1 / bc1), ib2 = f32x4.splat(1 / bc2), ev = f32x4.splat(eps);
  let i = s;
  for (; i + 4 <= e; i += 4) {
    const o = <usize>i << 2;
    const mh = f32x4.mul(v128.load(m + o), ib1);
    const vh = f32x4.mul(v128.load(v + o), ib2);
    const step = f32x4.div(mh, f32x4.add(f32x4.sqrt(vh), ev));
    v128.store(out + o, f32x4.sub(v128.load(params + o), f32x4.mul(kv, step)));
  }
  for (; i < e; i++) {
    const o = <usize>i << 2;
    const mh = load<f32>(m + o) * (1 / bc1);
    const vh = load<f32>(v + o) * (1 / bc2);
    store<f32>(out + o, load<f32>(params + o) - k * (mh / (Mathf.sqrt(vh) + eps)));
  }
}

/**
 * partials[c] = sum of x[i]^2 over chunk c = [c*chunk, (c+1)*chunk). Chunks,
 * not threads, fix the summation order, so the total is the same for any nt.
 */
export function sumSquares(partials: usize, x: usize, n: i32, chunk: i32, tid: i32, nt: i32): void {
  const chunks = (n + chunk - 1) / chunk;
  const c0 = shareStart(chunks, tid, nt), c1 = shareStart(chunks, tid + 1, nt);
  for (let c = c0; c < c1; c++) {
    const s = c * chunk, e = min(n, s + chunk);
    let acc = f32x4.splat(0);
    let i = s;
    for (; i + 4 <= e; i += 4) {
      const a = v128.load(x + (<usize>i << 2));
      acc = fma(a, a, acc);
    }
    let sum: f64 = <f64>f32x4.extract_lane(acc, 0) + <f64>f32x4.extract_lane(acc, 1) +
                   <f64>f32x4.extract_lane(acc, 2) + <f64>f32x4.extract_lane(acc, 3);
    for (; i < e; i++) {
      const a = <f64>load<f32>(x + (<usize>i << 2));
      sum += a * a;
    }
    store<f64>(partials + (<usize>c << 3), sum);
  }
}
