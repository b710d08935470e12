// Forward values against plain JavaScript references, and finite-difference
// gradient checks for every layer's backward pass.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import type { Tensor } from '../../src/engine/tensor.ts';
import * as L from '../../src/model/layers.ts';
import { checkGradient, fillRandom, weightedSum } from '../helpers/gradcheck.ts';

let engine: Engine;
before(async () => {
  engine = await Engine.create({ threads: 2 });
});
after(async () => {
  await engine.close();
});

const rand = (shape: number[], seed: number, scale = 1): Tensor => {
  const t = engine.tensor(shape);
  fillRandom(t.data, seed, scale);
  return t;
};

describe('linear', () => {
  const N = 6, C = 8, OC = 12;
  test('forward matches x·W + b', () => {
    const x = rand([N, C], 1), w = rand([C, OC], 2), b = rand([OC], 3), out = engine.tensor([N, OC]);
    L.linearForward(engine.kernels, out, x, w, b, N, C, OC);
    for (let n = 0; n < N; n++) for (let o = 0; o < OC; o++) {
      let s = b.data[o];
      for (let c = 0; c < C; c++) s += x.data[n * C + c] * w.data[c * OC + o];
      assert.ok(Math.abs(s - out.data[n * OC + o]) < 1e-5);
    }
  });
  test('backward: input, weight and bias gradients', () => {
    const k = engine.kernels;
    const x = rand([N, C], 4), w = rand([C, OC], 5), b = rand([OC], 6), out = engine.tensor([N, OC]);
    const R = fillRandom(new Float32Array(N * OC), 7);
    const dout = engine.tensorFrom([N, OC], R);
    const dx = engine.tensor([N, C]), dw = engine.tensor([C, OC]), db = engine.tensor([OC]);
    L.linearForward(k, out, x, w, b, N, C, OC);
    L.linearBackward(k, dx, dw, db, dout, x, w, N, C, OC);
    const loss = (): number => {
      L.linearForward(k, out, x, w, b, N, C, OC);
      return weightedSum(out.data, R);
    };
    checkGradient('linear dx', x.data, dx.data, loss);
    checkGradient('linear dw', w.data, dw.data, loss);
    checkGradient('linear db', b.data, db.data, loss);
  });
});

describe('layernorm', () => {
  const N = 5, C = 16;
  test('forward normalises each row', () => {
    const x = rand([N, C], 8, 3), w = engine.tensorFrom([C], new Float32Array(C).fill(1)), b = engine.tensor([C]);
    const out = engine.tensor([N, C]), mean = engine.tensor([N]), rstd = engine.tensor([N]);
    L.layernormForward(engine.kernels, out, mean, rstd, x, w, b, N, C);
    for (let n = 0; n < N; n++) {
      const row = out.data.subarray(n * C, (n + 1) * C);
      const m = row.reduce((a, v) => a + v, 0) / C;
      const v = row.reduce((a, x2) => a + (x2 - m) ** 2, 0) / C;
      assert.ok(Math.abs(m) < 1e-5);
      assert.ok(Math.abs(v - 1) < 1e-3);
    }
  });
  test('forward takes the config eps (GPT-2 layer_norm_epsilon)', () => {
    const n = 3, c = 8, eps = 0.5;
    const x = rand([n, c], 30), w = rand([c], 31), b = rand([c], 32);
    const out = engine.tensor([n, c]), mean = engine.tensor([n]), rstd = engine.tensor([n]);
    L.layernormForward(engine.kernels, out, mean, rstd, x, w, b, n, c, eps);
    for (let r = 0; r < n; r++) {
      const row = Array.from(x.data.subarray(r * c, (r + 1) * c));
      const m = row.reduce((a, v) => a + v, 0) / c;
      const s = 1 / Math.sqrt(row.reduce((a, v) => a + (v - m) ** 2, 0) / c + eps);
      assert.ok(Math.abs(rstd.data[r] - s) < 1e-6 * s);
      row.forEach((v, i) => assert.ok(Math.abs(out.data[r * c + i] - ((v - m) * s * w.data[i] + b.data[i])) < 1e-5));
    }
  });
  test('backward: input, gain and bias gradients', () => {
    const k = engine.kernels;
    const x = rand([N, C], 9, 2), w = rand([C], 10), b = rand([C], 11);
    const out = engine.tensor([N, C]), mean = engine.tensor([N]), rstd = engine.tensor([N]);
    const R = fillRandom(new Float32Array(N * C), 12);
    const dout = engine.tensorFrom([N, C], R);
    const dx = engine.tensor([N, C]), dw = engine.tensor([C]), db = engine.tensor([C]);
    L.layernormForward(k, out, mean, rstd, x, w, b, N, C);
    L.layernormBackward(k, dx, dw, db, dout, x, w, mean, rstd, N, C);
    const loss = (): number => {
      L.layernormForward(k, out, mean, rstd, x, w, b, N, C);
      return weightedSum(out.data, R);
    };
    checkGradient('layernorm dx', x.data, dx.data, loss);
    checkGradient('layernorm dw', w.data, dw.data, loss);
    checkGradient('layernorm db', b.data, db.data, loss);
  });
});

describe('embedding', () => {
  test('forward adds token and position rows; backward scatters', () => {
    const k = engine.kernels;
    const B = 2, T = 3, C = 8, V = 4;
    const wte = rand([V, C], 13), wpe = rand([T, C], 14), out = engine.tensor([B * T, C]);
    const tokens = engine.int32(B * T);
    tokens.data.set([0, 3, 3, 1, 0, 2]);
    L.embeddingForward(k, out, tokens, wte, wpe, B, T, C);
    for (let i = 0; i < B * T; i++) for (let c = 0; c < C; c++) {
      const want = wte.data[tokens.data[i] * C + c] + wpe.data[(i % T) * C + c];
      assert.equal(out.data[i * C + c], Math.fround(want));
    }
    const R = fillRandom(new Float32Array(B * T * C), 15);
    const dout = engine.tensorFrom([B * T, C], R);
    const dwte = engine.tensor([V, C]), dwpe = engine.tensor([T, C]);
    L.embeddingBackward(k, dwte, dwpe, dout, tokens, B, T, C);
    const loss = (): number => {
      L.embeddingForward(k, out, tokens, wte, wpe, B, T, C);
      return weightedSum(out.data, R);
    };
    checkGradient('embedding dwte', wte.data, dwte.data, loss, { samples: V * C });
    checkGradient('embedding dwpe', wpe.data, dwpe.data, loss);
  });
});

describe('attention', () => {
  const B = 2, T = 7, C = 16, NH = 2;
  test('forward is causal: a later position does not change earlier outputs', () => {
    const k = engine.kernels;
    const qkv = rand([B * T, 3 * C], 16), out = engine.tensor([B * T, C]), att = engine.tensor([B, NH, T, T]);
    L.attentionForward(k, out, att, qkv, B, T, C, NH);
    const before = out.data.slice();
    for (let c = 0; c < 3 * C; c++) qkv.data[(T - 1) * 3 * C + c] += 1; // change the last position of batch 0
    L.attentionForward(k, out, att, qkv, B, T, C, NH);
    for (let i = 0; i < (T - 1) * C; i++) assert.equal(out.data[i], before[i]);
    // rows of att sum to one over j <= i and are zero above
    for (let i = 0; i < T; i++) {
      let s = 0;
      for (let j = 0; j < T; j++) {
        const a = att.data[i * T + j];
        if (j > i) assert.equal(a, 0);
        s += a;
      }
      assert.ok(Math.abs(s - 1) < 1e-5);
    }
  });
  test('forward matches a plain reference', () => {
    const k = engine.kernels;
    const qkv = rand([B * T, 3 * C], 17), out = engine.tensor([B * T, C]), att = engine.tensor([B, NH, T, T]);
    L.attentionForward(k, out, att, qkv, B, T, C, NH);
    const hs = C / NH;
    const q = (b: number, t: number, h: number, d: number): number => qkv.data[(b * T + t) * 3 * C + h * hs + d];
    const kk = (b: number, t: number, h: number, d: number): number => qkv.data[(b * T + t) * 3 * C + C + h * hs + d];
    const v = (b: number, t: number, h: number, d: number): number => qkv.data[(b * T + t) * 3 * C + 2 * C + h * hs + d];
    for (let b = 0; b < B; b++) for (let h = 0; h < NH; h++) for (let i = 0; i < T; i++) {
      const s: number[] = [];
      for (let j = 0; j <= i; j++) {
        let dot = 0;
        for (let d = 0; d < hs; d++) dot += q(b, i, h, d) * kk(b, j, h, d);
        s.push(dot / Math.sqrt(hs));
      }
      const m = Math.max(...s);
      const e = s.map((x) => Math.exp(x - m));
      const z = e.reduce((a, x) => a + x, 0);
      for (let d = 0; d < hs; d++) {
        let o = 0;
        for (let j = 0; j <= i; j++) o += (e[j] / z) * v(b, j, h, d);
        assert.ok(Math.abs(o - out.data[(b * T + i) * C + h * hs + d]) < 1e-5);
      }
    }
  });
  test('backward: q, k and v gradients', () => {
    const k = engine.kernels;
    const qkv = rand([B * T, 3 * C], 18), out = engine.tensor([B * T, C]), att = engine.tensor([B, NH, T, T]);
    const R = fillRandom(new Float32Array(B * T * C), 19);
    const dout = engine.tensorFrom([B * T, C], R);
    const dqkv = engine.tensor([B * T, 3 * C]);
    L.attentionForward(k, out, att, qkv, B, T, C, NH);
    L.attentionBackward(k, dqkv, dout, qkv, att, B, T, C, NH);
    const loss = (): number => {
      L.attentionForward(k, out, att, qkv, B, T, C, NH);
      return weightedSum(out.data, R);
    };
    checkGradient('attention dqkv', qkv.data, dqkv.data, loss, { samples: 60 });
  });
});

describe('activations and residual', () => {
  const n = 37; // not a multiple of 4: exercises the scalar tails
  test('gelu forward (tanh form) and backward', () => {
    const k = engine.kernels;
    const x = rand([n], 20, 3), out = engine.tensor([n]);
    L.geluForward(k, out, x, n);
    for (let i = 0; i < n; i++) {
      const v = x.data[i];
      const want = 0.5 * v * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (v + 0.044715 * v ** 3)));
      assert.ok(Math.abs(want - out.data[i]) < 2e-6, `gelu(${v}) = ${out.data[i]}, want ${want}`);
    }
    const R = fillRandom(new Float32Array(n), 21);
    const dout = engine.tensorFrom([n], R), dx = engine.tensor([n]);
    L.geluBackward(k, dx, x, dout, n);
    checkGradient('gelu dx', x.data, dx.data, () => {
      L.geluForward(k, out, x, n);
      return weightedSum(out.data, R);
    }, { samples: n, eps: 1e-3 });
  });
  test('relu forward and backward', () => {
    const k = engine.kernels;
    const x = rand([n], 22), out = engine.tensor([n]);
    for (let i = 0; i < n; i++) if (Math.abs(x.data[i]) < 0.05) x.data[i] = 0.5; // keep away from the kink
    L.reluForward(k, out, x, n);
    for (let i = 0; i < n; i++) assert.equal(out.data[i], Math.max(0, x.data[i]));
    const R = fillRandom(new Float32Array(n), 23);
    const dout = engine.tensorFrom([n], R), dx = engine.tensor([n]);
    L.reluBackward(k, dx, x, dout, n);
    checkGradient('relu dx', x.data, dx.data, () => {
      L.reluForward(k, out, x, n);
      return weightedSum(out.data, R);
    }, { samples: n, eps: 1e-3 });
  });
  test('residual add: forward sums, backward feeds both branches', () => {
    const k = engine.kernels;
    const a = rand([n], 24), b = rand([n], 25), out = engine.tensor([n]);
    L.residualForward(k, out, a, b, n);
    for (let i = 0; i < n; i++) assert.equal(out.data[i], Math.fround(a.data[i] + b.data[i]));
    const R = fillRandom(new Float32Array(n), 26);
    const dout = engine.tensorFrom([n], R), da = engine.tensor([n]), db = engine.tensor([n]);
    L.residualBackward(k, da, db, dout, n);
    const loss = (): number => {
      L.residualForward(k, out, a, b, n);
      return weightedSum(out.data, R);
    };
    checkGradient('residual da', a.data, da.data, loss, { samples: n });
    checkGradient('residual db', b.data, db.data, loss, { samples: n });
  });
});

describe('softmax cross-entropy', () => {
  for (const V of [16, 10]) {
    test(`loss and logits gradient, V=${V}`, () => {
      const k = engine.kernels;
      const N = 5;
      const logits = rand([N, V], 27, 3), probs = engine.tensor([N, V]), losses = engine.tensor([N]);
      const targets = engine.int32(N);
      targets.data.set([0, V - 1, 3, 3, 7]);
      const mean = L.crossEntropyForward(k, losses, probs, logits, targets, N, V);
      let want = 0;
      for (let n = 0; n < N; n++) {
        const row = Array.from(logits.data.subarray(n * V, (n + 1) * V));
        const m = Math.max(...row);
        const z = row.reduce((a, x) => a + Math.exp(x - m), 0);
        want += Math.log(z) - (row[targets.data[n]] - m);
      }
      assert.ok(Math.abs(mean - want / N) < 1e-5);
      const dlogits = engine.tensor([N, V]);
      L.crossEntropyBackward(k, dlogits, probs, targets, N, V);
      checkGradient('cross-entropy dlogits', logits.data, dlogits.data, () => L.crossEntropyForward(k, losses, probs, logits, targets, N, V), { samples: 40 });
    });
  }
});
