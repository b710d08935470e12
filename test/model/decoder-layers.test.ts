// The Llama-family layers (src/model/decoder-layers.ts): forward values
// against plain float64 references, finite-difference gradient checks of
// every backward, and what each backward writes or accumulates.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import type { Tensor } from '../../src/engine/tensor.ts';
import * as D from '../../src/model/decoder-layers.ts';
import * as L from '../../src/model/layers.ts';
import { createRopeTable, type RopeTable } from '../../src/model/rope.ts';
import { checkGradient, fillRandom, weightedSum } from '../helpers/gradcheck.ts';

let engine: Engine;
let table: RopeTable;
before(async () => {
  engine = await Engine.create({ threads: 2 });
  table = createRopeTable(engine, { headDim: 8, ropeTheta: 10000, ropeScaling: null }, 64);
});
after(async () => {
  await engine.close();
});

const rand = (shape: number[], seed: number, scale = 1): Tensor => {
  const t = engine.tensor(shape);
  fillRandom(t.data, seed, scale);
  return t;
};

const near = (got: ArrayLike<number>, want: ArrayLike<number>, tol: number, what: string): void => {
  assert.equal(got.length, want.length, `${what}: length`);
  for (let i = 0; i < want.length; i++) {
    assert.ok(Math.abs(got[i] - want[i]) <= tol * (1 + Math.abs(want[i])), `${what}[${i}]: ${got[i]} vs ${want[i]}`);
  }
};

describe('rmsnorm', () => {
  for (const C of [16, 18]) {
    test(`forward matches x · rsqrt(mean(x²) + eps) · w (C = ${C})`, () => {
      const N = 5, eps = 1e-3;
      const x = rand([N, C], 1, 2), w = rand([C], 2), out = engine.tensor([N, C]), rstd = engine.tensor([N]);
      D.rmsnormForward(engine.kernels, out, rstd, x, w, eps, N, C);
      for (let n = 0; n < N; n++) {
        let ss = 0;
        for (let c = 0; c < C; c++) ss += x.data[n * C + c] ** 2;
        const r = 1 / Math.sqrt(ss / C + eps);
        near([rstd.data[n]], [r], 1e-6, 'rstd');
        const want = Array.from({ length: C }, (_, c) => x.data[n * C + c] * r * w.data[c]);
        near(out.data.subarray(n * C, (n + 1) * C), want, 1e-6, `row ${n}`);
      }
    });
    test(`backward: input (+=) and weight (+=) gradients (C = ${C})`, () => {
      const k = engine.kernels, N = 4, eps = 1e-5;
      const x = rand([N, C], 3, 2), w = rand([C], 4), out = engine.tensor([N, C]), rstd = engine.tensor([N]);
      const R = fillRandom(new Float32Array(N * C), 5);
      const dout = engine.tensorFrom([N, C], R);
      const before = fillRandom(new Float32Array(N * C), 6), beforeW = fillRandom(new Float32Array(C), 7);
      const dx = engine.tensorFrom([N, C], before), dw = engine.tensorFrom([C], beforeW);
      D.rmsnormForward(k, out, rstd, x, w, eps, N, C);
      D.rmsnormBackward(k, dx, dw, dout, x, w, rstd, N, C);
      const gx = dx.data.map((v, i) => v - before[i]), gw = dw.data.map((v, i) => v - beforeW[i]);
      const loss = (): number => {
        D.rmsnormForward(k, out, rstd, x, w, eps, N, C);
        return weightedSum(out.data, R);
      };
      checkGradient('rmsnorm dx', x.data, gx, loss);
      checkGradient('rmsnorm dw', w.data, gw, loss, { samples: C });
    });
  }
});

// ---- RoPE -------------------------------------------------------------------

const shape = { heads: 4, kvHeads: 2, headDim: 8 };
const W = D.qkvWidth(shape); // 64

/** HF's q·cos + rotate_half(q)·sin on every q and k head of a qkv row, in float64 from the table's cos/sin. */
function refRope(row: ArrayLike<number>, pos: number, s: D.HeadShape, t: RopeTable): number[] {
  const out = Array.from(row);
  const Dh = s.headDim, half = Dh / 2, tab = t.tensor.data;
  for (let h = 0; h < s.heads + s.kvHeads; h++) {
    for (let i = 0; i < half; i++) {
      const c = tab[pos * Dh + i], sn = tab[pos * Dh + half + i];
      const x1 = row[h * Dh + i], x2 = row[h * Dh + half + i];
      out[h * Dh + i] = x1 * c - x2 * sn;
      out[h * Dh + half + i] = x2 * c + x1 * sn;
    }
  }
  return out;
}

describe('rope', () => {
  const B = 2, T = 5, N = B * T;
  test('forward turns the q and k heads as rotate_half does, leaves v alone', () => {
    const qkv = rand([N, W], 11), x0 = qkv.data.slice();
    const pos = D.sequencePositions(engine.int32(N), B, T);
    D.ropeForward(engine.kernels, qkv, N, shape, pos, table);
    for (let r = 0; r < N; r++) near(qkv.data.subarray(r * W, (r + 1) * W), refRope(x0.subarray(r * W, (r + 1) * W), r % T, shape, table), 1e-6, `row ${r}`);
    assert.deepEqual(qkv.data.subarray(0, W).slice(), x0.subarray(0, W), 'position 0 does not turn');
  });
  test('arbitrary positions give the rows of the full-sequence result, bit for bit', () => {
    const T2 = 40;
    const full = rand([T2, W], 12), x0 = full.data.slice();
    D.ropeForward(engine.kernels, full, T2, shape, D.sequencePositions(engine.int32(T2), 1, T2), table);
    const picks = [37, 3, 0, 21, 21, 9];
    const some = engine.tensor([picks.length, W]);
    picks.forEach((p, r) => some.data.set(x0.subarray(p * W, (p + 1) * W), r * W));
    // positions in the second column of a (base, position) row table, as the cached path reads them
    const rows = engine.int32(2 * picks.length);
    picks.forEach((p, r) => (rows.data[2 * r + 1] = p));
    D.ropeForward(engine.kernels, some, picks.length, shape, { buffer: rows, offset: 1, stride: 2 }, table);
    picks.forEach((p, r) => assert.deepEqual(some.data.subarray(r * W, (r + 1) * W), full.data.subarray(p * W, (p + 1) * W), `position ${p}`));
  });
  test('backward is the inverse rotation: gradient check, and forward then backward is the identity', () => {
    const k = engine.kernels;
    const x = rand([N, W], 13), y = engine.tensor([N, W]);
    const pos = D.sequencePositions(engine.int32(N), B, T);
    const R = fillRandom(new Float32Array(N * W), 14);
    const g = engine.tensorFrom([N, W], R);
    D.ropeBackward(k, g, N, shape, pos, table);
    const loss = (): number => {
      y.data.set(x.data);
      D.ropeForward(k, y, N, shape, pos, table);
      return weightedSum(y.data, R);
    };
    checkGradient('rope dx', x.data, g.data, loss, { samples: 80 });
    y.data.set(x.data);
    D.ropeForward(k, y, N, shape, pos, table);
    D.ropeBackward(k, y, N, shape, pos, table);
    near(y.data, x.data, 1e-6, 'identity');
  });
  test('odd half-widths (scalar tails) and refused positions', () => {
    const s = { heads: 1, kvHeads: 1, headDim: 12 };
    const t12 = createRopeTable(engine, { headDim: 12, ropeTheta: 10000, ropeScaling: null }, 8);
    const qkv = rand([3, D.qkvWidth(s)], 15), x0 = qkv.data.slice(), Wd = D.qkvWidth(s);
    const pos = engine.int32(3);
    pos.data.set([7, 0, 4]);
    const rows: D.RowPositions = { buffer: pos, offset: 0, stride: 1 };
    D.ropeForward(engine.kernels, qkv, 3, s, rows, t12);
    [7, 0, 4].forEach((p, r) => near(qkv.data.subarray(r * Wd, (r + 1) * Wd), refRope(x0.subarray(r * Wd, (r + 1) * Wd), p, s, t12), 1e-6, `row ${r}`));
    pos.data[1] = 8;
    assert.throws(() => D.ropeForward(engine.kernels, qkv, 3, s, rows, t12), /position 8, outside the table's 0\.\.7/);
    assert.throws(() => D.ropeForward(engine.kernels, qkv, 3, shape, rows, t12), /table for headDim 12/);
    engine.free(t12.tensor);
  });
});

// ---- SwiGLU -----------------------------------------------------------------

describe('swiglu', () => {
  const N = 3, I = 13; // odd width: rows start mid-vector, scalar tails
  test('forward is silu(gate) · up from [gate | up]', () => {
    const inp = rand([N, 2 * I], 16, 4), out = engine.tensor([N, I]);
    D.swigluForward(engine.kernels, out, inp, N, I);
    const want: number[] = [];
    for (let r = 0; r < N; r++) for (let c = 0; c < I; c++) {
      const g = inp.data[r * 2 * I + c], u = inp.data[r * 2 * I + I + c];
      want.push((g / (1 + Math.exp(-g))) * u);
    }
    near(out.data, want, 2e-6, 'swiglu');
  });
  test('backward writes both halves: gradient check', () => {
    const k = engine.kernels;
    const inp = rand([N, 2 * I], 17, 3), out = engine.tensor([N, I]);
    const R = fillRandom(new Float32Array(N * I), 18);
    const dout = engine.tensorFrom([N, I], R), dinp = engine.tensorFrom([N, 2 * I], new Float32Array(N * 2 * I).fill(99));
    D.swigluBackward(k, dinp, inp, dout, N, I);
    checkGradient('swiglu dinp', inp.data, dinp.data, () => {
      D.swigluForward(k, out, inp, N, I);
      return weightedSum(out.data, R);
    }, { samples: N * 2 * I, eps: 1e-3 });
  });
});

// ---- grouped-query attention -------------------------------------------------

/** Causal attention of qkv rows (B·T × (H + 2KV)·D) in float64: query head h reads kv head floor(h / (H / KV)). */
function refGqa(qkv: Float32Array, B: number, T: number, s: D.HeadShape): number[] {
  const { heads: H, kvHeads: KV, headDim: Dh } = s;
  const Wd = D.qkvWidth(s), rep = H / KV;
  const out = new Array<number>(B * T * H * Dh).fill(0);
  for (let b = 0; b < B; b++) for (let h = 0; h < H; h++) {
    const g = Math.floor(h / rep);
    const at = (t: number, col: number): number => qkv[(b * T + t) * Wd + col];
    for (let i = 0; i < T; i++) {
      const sc: number[] = [];
      for (let j = 0; j <= i; j++) {
        let dot = 0;
        for (let d = 0; d < Dh; d++) dot += at(i, h * Dh + d) * at(j, (H + g) * Dh + d);
        sc.push(dot / Math.sqrt(Dh));
      }
      const m = Math.max(...sc), e = sc.map((x) => Math.exp(x - m)), z = e.reduce((a, x) => a + x, 0);
      for (let d = 0; d < Dh; d++) {
        let o = 0;
        for (let j = 0; j <= i; j++) o += (e[j] / z) * at(j, (H + KV + g) * Dh + d);
        out[(b * T + i) * H * Dh + h * Dh + d] = o;
      }
    }
  }
  return out;
}

describe('grouped-query attention', () => {
  const B = 2, T = 6;
  for (const s of [{ heads: 4, kvHeads: 2, headDim: 8 }, { heads: 4, kvHeads: 1, headDim: 8 }, { heads: 2, kvHeads: 2, headDim: 12 }]) {
    const name = `heads ${s.heads}, kvHeads ${s.kvHeads}, headDim ${s.headDim}`;
    const Wd = D.qkvWidth(s), OW = s.heads * s.headDim;
    test(`forward matches a float64 reference (${name})`, () => {
      const qkv = rand([B * T, Wd], 19, 2), out = engine.tensor([B * T, OW]), att = engine.tensor([B, s.heads, T, T]);
      D.gqaAttentionForward(engine.kernels, out, att, qkv, B, T, s);
      near(out.data, refGqa(qkv.data, B, T, s), 2e-6, name);
    });
    test(`backward writes dq, dk and dv (dk, dv summed over each group): gradient check (${name})`, () => {
      const k = engine.kernels;
      const qkv = rand([B * T, Wd], 20, 1.5), out = engine.tensor([B * T, OW]), att = engine.tensor([B, s.heads, T, T]);
      const R = fillRandom(new Float32Array(B * T * OW), 21);
      const dout = engine.tensorFrom([B * T, OW], R), dqkv = engine.tensorFrom([B * T, Wd], new Float32Array(B * T * Wd).fill(99));
      D.gqaAttentionForward(k, out, att, qkv, B, T, s);
      D.gqaAttentionBackward(k, dqkv, dout, qkv, att, B, T, s);
      checkGradient(`gqa dqkv (${name})`, qkv.data, dqkv.data, () => {
        D.gqaAttentionForward(k, out, att, qkv, B, T, s);
        return weightedSum(out.data, R);
      }, { samples: 120 });
    });
  }
  test('refuses heads that are not a multiple of kvHeads, and a headDim that is not a multiple of 4', () => {
    const t = engine.tensor([64]);
    assert.throws(() => D.gqaAttentionForward(engine.kernels, t, t, t, 1, 1, { heads: 3, kvHeads: 2, headDim: 8 }), /multiple of kvHeads/);
    assert.throws(() => D.gqaAttentionForward(engine.kernels, t, t, t, 1, 1, { heads: 2, kvHeads: 1, headDim: 6 }), /multiple of 4/);
  });
});

test('an attention block with headDim ≠ channels/heads: linear → RoPE → GQA → linear, gradients end to end', () => {
  const k = engine.kernels;
  const B = 2, T = 5, N = B * T, C = 12; // 4 heads of 8 floats on 12 channels
  const OW = shape.heads * shape.headDim;
  const x = rand([N, C], 22), wqkv = rand([C, W], 23, 0.5), bqkv = rand([W], 24, 0.5), wo = rand([OW, C], 25, 0.5);
  const qkv = engine.tensor([N, W]), y = engine.tensor([N, OW]), att = engine.tensor([B, shape.heads, T, T]), out = engine.tensor([N, C]);
  const pos = D.sequencePositions(engine.int32(N), B, T);
  const forward = (): void => {
    L.linearForward(k, qkv, x, wqkv, bqkv, N, C, W);
    D.ropeForward(k, qkv, N, shape, pos, table);
    D.gqaAttentionForward(k, y, att, qkv, B, T, shape);
    L.linearForward(k, out, y, wo, null, N, OW, C);
  };
  const R = fillRandom(new Float32Array(N * C), 26);
  const dout = engine.tensorFrom([N, C], R);
  const dx = engine.tensor([N, C]), dwqkv = engine.tensor([C, W]), dbqkv = engine.tensor([W]), dwo = engine.tensor([OW, C]);
  const dy = engine.tensor([N, OW]), dqkv = engine.tensor([N, W]);
  forward();
  L.linearBackward(k, dy, dwo, null, dout, y, wo, N, OW, C);
  D.gqaAttentionBackward(k, dqkv, dy, qkv, att, B, T, shape);
  D.ropeBackward(k, dqkv, N, shape, pos, table);
  L.linearBackward(k, dx, dwqkv, dbqkv, dqkv, x, wqkv, N, C, W);
  const loss = (): number => {
    forward();
    return weightedSum(out.data, R);
  };
  checkGradient('block dx', x.data, dx.data, loss, { samples: 40 });
  checkGradient('block dwqkv', wqkv.data, dwqkv.data, loss, { samples: 60 });
  checkGradient('block dbqkv (Qwen2 biases)', bqkv.data, dbqkv.data, loss, { samples: 40 });
  checkGradient('block dwo', wo.data, dwo.data, loss, { samples: 40 });
});
