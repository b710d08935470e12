// sgemm against a double-precision reference for every transpose case, odd
// sizes, bias and accumulation; and bitwise equality across thread counts.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { fillRandom } from '../helpers/gradcheck.ts';

let one: Engine;
let two: Engine;
before(async () => {
  one = await Engine.create({ threads: 1 });
  two = await Engine.create({ threads: 2 });
});
after(async () => {
  await one.close();
  await two.close();
});

interface Case { M: number; N: number; K: number; transA: boolean; transB: boolean; bias: boolean; accumulate: boolean }

function reference(c: Case, a: Float32Array, b: Float32Array, bias: Float32Array, c0: Float32Array): Float64Array {
  const out = new Float64Array(c.M * c.N);
  for (let i = 0; i < c.M; i++) for (let j = 0; j < c.N; j++) {
    let s = c.accumulate ? c0[i * c.N + j] : c.bias ? bias[j] : 0;
    for (let k = 0; k < c.K; k++) {
      const av = c.transA ? a[k * c.M + i] : a[i * c.K + k];
      const bv = c.transB ? b[j * c.K + k] : b[k * c.N + j];
      s += av * bv;
    }
    out[i * c.N + j] = s;
  }
  return out;
}

function run(engine: Engine, c: Case, seed: number): { got: Float32Array; want: Float64Array } {
  const a = engine.tensor([c.M * c.K]), b = engine.tensor([c.K * c.N]), out = engine.tensor([c.M * c.N]), bias = engine.tensor([c.N]);
  fillRandom(a.data, seed);
  fillRandom(b.data, seed + 1);
  fillRandom(bias.data, seed + 2);
  fillRandom(out.data, seed + 3);
  const c0 = out.data.slice();
  engine.kernels.sgemm({
    M: c.M, N: c.N, K: c.K,
    a: a.ptr, lda: c.transA ? c.M : c.K, transA: c.transA,
    b: b.ptr, ldb: c.transB ? c.K : c.N, transB: c.transB,
    c: out.ptr, ldc: c.N, accumulate: c.accumulate, bias: c.bias ? bias.ptr : undefined,
  });
  const want = reference(c, a.data, b.data, bias.data, c0);
  const got = out.data.slice();
  for (const t of [a, b, out, bias]) engine.free(t);
  return { got, want };
}

test('every transpose case, odd sizes, bias and accumulate match the reference', () => {
  const sizes = [[1, 1, 1], [5, 7, 3], [13, 9, 17], [33, 70, 300], [64, 520, 40]];
  let seed = 1;
  for (const [M, N, K] of sizes) for (const transA of [false, true]) for (const transB of [false, true]) {
    for (const [bias, accumulate] of [[false, false], [true, false], [false, true]]) {
      const c = { M, N, K, transA, transB, bias, accumulate };
      const { got, want } = run(two, c, seed++);
      for (let i = 0; i < want.length; i++) {
        assert.ok(Math.abs(got[i] - want[i]) <= 1e-5 * (K + 1), `${JSON.stringify(c)} at ${i}: ${got[i]} vs ${want[i]}`);
      }
    }
  }
});

test('results are bitwise identical with 1 and 2 threads', () => {
  const c = { M: 97, N: 600, K: 530, transA: true, transB: false, bias: false, accumulate: true };
  assert.deepEqual(run(one, c, 99).got, run(two, c, 99).got);
  const d = { M: 768, N: 384, K: 128, transA: false, transB: true, bias: true, accumulate: false };
  assert.deepEqual(run(one, d, 7).got, run(two, d, 7).got);
});

test('a product of at most 8 rows (unpacked, columns split between threads) gives the bits of the same rows in a larger product, on 1 and 2 threads', () => {
  // the first rows of a 12-row product (the packed path) against 1-, 3- and 8-row products of the same A rows, B, bias and C
  const N = 1037, K = 600; // N not a multiple of 4; K over three packed blocks
  for (const [bias, accumulate] of [[false, false], [true, false], [false, true]]) {
    const product = (engine: Engine, M: number): Float32Array => {
      const a = engine.tensor([12 * K]), b = engine.tensor([K * N]), biasT = engine.tensor([N]), out = engine.tensor([12 * N]);
      fillRandom(a.data, 3);
      fillRandom(b.data, 4);
      fillRandom(biasT.data, 5);
      fillRandom(out.data, 6);
      engine.kernels.sgemm({ M, N, K, a: a.ptr, lda: K, b: b.ptr, ldb: N, c: out.ptr, ldc: N, accumulate, bias: bias ? biasT.ptr : undefined });
      const got = out.data.slice(0, M * N);
      for (const t of [a, b, biasT, out]) engine.free(t);
      return got;
    };
    const big = product(one, 12);
    for (const engine of [one, two]) {
      for (const M of [1, 3, 8]) assert.deepEqual(product(engine, M), big.slice(0, M * N), `M ${M}, ${engine.threads} threads, bias ${bias}, accumulate ${accumulate}`);
    }
  }
});

test('the plain-SIMD build (no relaxed FMA) computes the same products within rounding', async () => {
  const plain = await Engine.create({ threads: 2, simd: 'plain' });
  try {
    assert.equal(plain.relaxedSimd, false);
    const c = { M: 40, N: 72, K: 300, transA: false, transB: true, bias: true, accumulate: false };
    const { got, want } = run(plain, c, 5);
    for (let i = 0; i < want.length; i++) assert.ok(Math.abs(got[i] - want[i]) <= 1e-5 * c.K);
  } finally {
    await plain.close();
  }
});
