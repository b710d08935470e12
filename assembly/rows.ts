// Row-wise kernels over an N×C activation: token + position embedding, layer
// norm, bias gradients, softmax cross-entropy. Forward passes split rows
// across threads; parameter gradients split columns, so each gradient element
// is summed over rows in the same order for any thread count.
import { exp1, exp4, fma, hsum, shareStart } from './simd';

// @ts-ignore: decorator
@inline function rowPtr(base: usize, row: i32, C: i32): usize {
  return base + ((<usize>row * C) << 2);
}

/** Column range [c0, c1) for thread tid, in whole vectors of 4 columns. */
// @ts-ignore: decorator
@inline function colStart(C: i32, tid: i32, nt: i32): i32 {
  const vecs = (C + 3) >> 2;
  return min(C, shareStart(vecs, tid, nt) << 2);
}

/** out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] */
export function embeddingForward(out: usize, tokens: usize, wte: usize, wpe: usize, B: i32, T: i32, C: i32, tid: i32, nt: i32): void {
  const N = B * T;
  const r0 = shareStart(N, tid, nt), r1 = shareStart(N, tid + 1, nt);
  for (let r = r0; r < r1; r++) {
    const t = r % T;
    const tok = load<i32>(tokens + (<usize>r << 2));
    const o = rowPtr(out, r, C), e = rowPtr(wte, tok, C), p = rowPtr(wpe, t, C);
    for (let c = 0; c < C; c += 4) {
      const k = <usize>c << 2;
      v128.store(o + k, f32x4.add(v128.load(e + k), v128.load(p + k)));
    }
  }
}

/** dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:]. Threads split columns. */
export function embeddingBackward(dwte: usize, dwpe: usize, dout: usize, tokens: usize, B: i32, T: i32, C: i32, tid: i32, nt: i32): void {
  const c0 = colStart(C, tid, nt), c1 = colStart(C, tid + 1, nt);
  const N = B * T;
  for (let r = 0; r < N; r++) {
    const t = r % T;
    const tok = load<i32>(tokens + (<usize>r << 2));
    const d = rowPtr(dout, r, C), e = rowPtr(dwte, tok, C), p = rowPtr(dwpe, t, C);
    for (let c = c0; c < c1; c += 4) {
      const k = <usize>c << 2;
      const g = v128.load(d + k);
      v128.store(e + k, f32x4.add(v128.load(e + k), g));
      v128.store(p + k, f32x4.add(v128.load(p + k), g));
    }
  }
}

/**
 * out = (inp - mean) * rstd * weight + bias, per row, rstd = 1 / √(var + eps);
 * saves mean and rstd. C must be a multiple of 4.
 */
export function layernormForward(out: usize, mean: usize, rstd: usize, inp: usize, weight: usize, bias: usize, N: i32, C: i32, eps: f32, tid: i32, nt: i32): void {
  const r0 = shareStart(N, tid, nt), r1 = shareStart(N, tid + 1, nt);
  const invC: f32 = 1 / <f32>C;
  for (let r = r0; r < r1; r++) {
    const x = rowPtr(inp, r, C), o = rowPtr(out, r, C);
    let acc = f32x4.splat(0);
    for (let c = 0; c < C; c += 4) acc = f32x4.add(acc, v128.load(x + (<usize>c << 2)));
    const m = hsum(acc) * invC;
    const mv = f32x4.splat(m);
    let vacc = f32x4.splat(0);
    for (let c = 0; c < C; c += 4) {
      const d = f32x4.sub(v128.load(x + (<usize>c << 2)), mv);
      vacc = fma(d, d, vacc);
    }
    const s: f32 = 1 / Mathf.sqrt(hsum(vacc) * invC + eps);
    const sv = f32x4.splat(s);
    for (let c = 0; c < C; c += 4) {
      const k = <usize>c << 2;
      const n = f32x4.mul(f32x4.sub(v128.load(x + k), mv), sv);
      v128.store(o + k, fma(n, v128.load(weight + k), v128.load(bias + k)));
    }
    store<f32>(mean + (<usize>r << 2), m);
    store<f32>(rstd + (<usize>r << 2), s);
  }
}

/**
 * dinp += layer-norm input gradient, per row:
 * dinp = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dout * weight.
 */
export function layernormBackwardInput(dinp: usize, dout: usize, inp: usize, weight: usize, mean: usize, rstd: usize, N: i32, C: i32, tid: i32, nt: i32): void {
  const r0 = shareStart(N, tid, nt), r1 = shareStart(N, tid + 1, nt);
  const invC: f32 = 1 / <f32>C;
  for (let r = r0; r < r1; r++) {
    const x = rowPtr(inp, r, C), d = rowPtr(dout, r, C), di = rowPtr(dinp, r, C);
    const mv = f32x4.splat(load<f32>(mean + (<usize>r << 2)));
    const s = load<f32>(rstd + (<usize>r << 2));
    const sv = f32x4.splat(s);
    let a1 = f32x4.splat(0), a2 = f32x4.splat(0);
    for (let c = 0; c < C; c += 4) {
      const k = <usize>c << 2;
      const xhat = f32x4.mul(f32x4.sub(v128.load(x + k), mv), sv);
      const dn = f32x4.mul(v128.load(d + k), v128.load(weight + k));
      a1 = f32x4.add(a1, dn);
      a2 = fma(dn, xhat, a2);
    }
    const m1 = f32x4.splat(hsum(a1) * invC);
    const m2 = f32x4.splat(hsum(a2) * invC);
    for (let c = 0; c < C; c += 4) {
      const k = <usize>c << 2;
      const xhat = f32x4.mul(f32x4.sub(v128.load(x + k), mv), sv);
      const dn = f32x4.mul(v128.load(d + k), v128.load(weight + k));
      const g = f32x4.mul(f32x4.sub(f32x4.sub(dn, m1), f32x4.mul(xhat, m2)), sv);
      v128.store(di + k, f32x4.add(v128.load(di + k), g));
    }
  }
}

/** dweight += sum over rows of dout * xhat; dbias += sum of dout. Threads split columns. */
export function layernormBackwardParams(dweight: usize, dbias: usize, dout: usize, inp: usize, mean: usize, rstd: usize, N: i32, C: i32, tid: i32, nt: i32): void {
  const c0 = colStart(C, tid, nt), c1 = colStart(C, tid + 1, nt);
  for (let c = c0; c < c1; c += 4) {
    const k = <usize>c << 2;
    let gw = f32x4.splat(0), gb = f32x4.splat(0);
    for (let r = 0; r < N; r++) {
      const mv = f32x4.splat(load<f32>(mean + (<usize>r << 2)));
      const sv = f32x4.splat(load<f32>(rstd + (<usize>r << 2)));
      const xhat = f32x4.mul(f32x4.sub(v128.load(rowPtr(inp, r, C) + k), mv), sv);
      const g = v128.load(rowPtr(dout, r, C) + k);
      gw = fma(g, xhat, gw);
      gb = f32x4.add(gb, g);
    }
    v128.store(dweight + k, f32x4.add(v128.load(dweight + k), gw));
    v128.store(dbias + k, f32x4.add(v128.load(dbias + k), gb));
  }
}

/** dbias[c] += sum over rows of dout[r, c]. Threads split columns. */
export function biasBackward(dbias: usize, dout: usize, N: i32, C: i32, tid: i32, nt: i32): void {
  const c0 = colStart(C, tid, nt), c1 = colStart(C, tid + 1, nt);
  // four column vectors at a time to keep several accumulators in flight
  let c = c0;
  for (; c + 16 <= c1; c += 16) {
    const k = <usize>c << 2;
    let a0 = f32x4.splat(0), a1 = f32x4.splat(0), a2 = f32x4.splat(0), a3 = f32x4.splat(0);
    for (let r = 0; r < N; r++) {
      const p = rowPtr(dout, r, C) + k;
      a0 = f32x4.add(a0, v128.load(p));
      a1 = f32x4.add(a1, v128.load(p, 16));
      a2 = f32x4.add(a2, v128.load(p, 32));
      a3 = f32x4.add(a3, v128.load(p, 48));
    }
    v128.store(dbias + k, f32x4.add(v128.load(dbias + k), a0));
    v128.store(dbias + k, f32x4.add(v128.load(dbias + k, 16), a1), 16);
    v128.store(dbias + k, f32x4.add(v128.load(dbias + k, 32), a2), 32);
    v128.store(dbias + k, f32x4.add(v128.load(dbias + k, 48), a3), 48);
  }
  for (; c + 4 <= c1; c += 4) {
    const k = <usize>c << 2;
    let a = f32x4.splat(0);
    for (let r = 0; r < N; r++) a = f32x4.add(a, v128.load(rowPtr(dout, r, C) + k));
    v128.store(dbias + k, f32x4.add(v128.load(dbias + k), a));
  }
  for (; c < c1; c++) {
    const k = <usize>c << 2;
    let a: f32 = 0;
    for (let r = 0; r < N; r++) a += load<f32>(rowPtr(dout, r, C) + k);
    store<f32>(dbias + k, load<f32>(dbias + k) + a);
  }
}

/**
 * Softmax over each row of logits (N×V) into probs, and losses[r] =
 * -log probs[r, targets[r]].
 */
export function crossEntropyForward(losses: usize, probs: usize, logits: usize, targets: usize, N: i32, V: i32, tid: i32, nt: i32): void {
  const r0 = shareStart(N, tid, nt), r1 = shareStart(N, tid + 1, nt);
  if (V & 3) {
    crossEntropyForwardScalar(losses, probs, logits, targets, r0, r1, V);
    return;
  }
  for (let r = r0; r < r1; r++) {
    const l = rowPtr(logits, r, V), p = rowPtr(probs, r, V);
    let mx = f32x4.splat(-Infinity);
    for (let c = 0; c < V; c += 4) mx = f32x4.max(mx, v128.load(l + (<usize>c << 2)));
    const m = max(max(f32x4.extract_lane(mx, 0), f32x4.extract_lane(mx, 1)), max(f32x4.extract_lane(mx, 2), f32x4.extract_lane(mx, 3)));
    const mv = f32x4.splat(m);
    let sum = f32x4.splat(0);
    for (let c = 0; c < V; c += 4) {
      const k = <usize>c << 2;
      const e = exp4(f32x4.sub(v128.load(l + k), mv));
      v128.store(p + k, e);
      sum = f32x4.add(sum, e);
    }
    const total = hsum(sum);
    const inv = f32x4.splat(1 / total);
    for (let c = 0; c < V; c += 4) {
      const k = <usize>c << 2;
      v128.store(p + k, f32x4.mul(v128.load(p + k), inv));
    }
    const target = load<i32>(targets + (<usize>r << 2));
    // -log softmax computed from the logits for accuracy: log(total) - (l - m)
    const lt = load<f32>(l + (<usize>target << 2));
    store<f32>(losses + (<usize>r << 2), Mathf.log(total) - (lt - m));
  }
}

/** dlogits = (probs - onehot(targets)) * scale, per row. */
export function crossEntropyBackward(dlogits: usize, probs: usize, targets: usize, scale: f32, N: i32, V: i32, tid: i32, nt: i32): void {
  const r0 = shareStart(N, tid, nt), r1 = shareStart(N, tid + 1, nt);
  const sv = f32x4.splat(scale);
  for (let r = r0; r < r1; r++) {
    const p = rowPtr(probs, r, V), d = rowPtr(dlogits, r, V);
    let c = 0;
    for (; c + 4 <= V; c += 4) {
      const k = <usize>c << 2;
      v128.store(d + k, f32x4.mul(v128.load(p + k), sv));
    }
    for (; c < V; c++) store<f32>(d + (<usize>c << 2), load<f32>(p + (<usize>c << 2)) * scale);
    const target = load<i32>(targets + (<usize>r << 2));
    const at = d + (<usize>target << 2);
    store<f32>(at, (load<f32>(p + (<usize>target << 2)) - 1) * scale);
  }
}

/** crossEntropyForward for rows whose length is not a multiple of 4. */
function crossEntropyForwardScalar(losses: usize, probs: usize, logits: usize, targets: usize, r0: i32, r1: i32, V: i32): void {
  for (let r = r0; r < r1; r++) {
    const l = rowPtr(logits, r, V), p = rowPtr(probs, r, V);
    let m: f32 = -Infinity;
    for (let c = 0; c < V; c++) m = max(m, load<f32>(l + (<usize>c << 2)));
    let total: f32 = 0;
    for (let c = 0; c < V; c++) {
      const e = exp1(load<f32>(l + (<usize>c << 2)) - m);
      store<f32>(p + (<usize>c << 2), e);
      total += e;
    }
    const inv: f32 = 1 / total;
    for (let c = 0; c < V; c++) store<f32>(p + (<usize>c << 2), load<f32>(p + (<usize>c << 2)) * inv);
    const target = load<i32>(targets + (<usize>r << 2));
    store<f32>(losses + (<usize>r << 2), Mathf.log(total) - (load<f32>(l + (<usize>target << 2)) - m));
  }
}
