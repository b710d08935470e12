import { test } from 'node:test';
import assert from 'node:assert/strict';
import { AGGREGATORS, aggregate, median, signedGeometricMean, trimmedMean, weightedMean } from '../../src/merge/aggregate.ts';
import { MergeError } from '../../src/merge/errors.ts';
import { expectMergeError, randomVector } from './helpers.ts';

function slicesOf(R: number, n: number, seed: number): Float32Array[] {
  return Array.from({ length: R }, (_, r) => randomVector(n, seed * 100 + r, 1 + r));
}

/** Per-element reference: apply `f` to the R values at each index (plain JS sort). */
function reference(slices: Float32Array[], f: (values: number[]) => number): Float32Array {
  const n = slices[0].length;
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = f(slices.map((s) => s[i]));
  return out;
}

const sorted = (v: number[]): number[] => [...v].sort((a, b) => a - b);
const mean = (v: number[]): number => v.reduce((s, x) => s + x, 0) / v.length;

test('weightedMean: equal weights = plain mean, for R = 1..9', () => {
  for (let R = 1; R <= 9; R++) {
    const s = slicesOf(R, 1000, R);
    assert.deepEqual(weightedMean(s), reference(s, mean), `R=${R}`);
    assert.deepEqual(aggregate(s), reference(s, mean));
  }
});

test('weightedMean: sample weights, zero weights, out buffer aliasing a slice', () => {
  const s = slicesOf(3, 500, 7);
  const w = [10, 30, 0];
  const want = reference(s, (v) => (10 * v[0] + 30 * v[1]) / 40);
  assert.deepEqual(weightedMean(s, w), want);
  assert.deepEqual(aggregate(s, { method: 'mean', weights: w }), want);
  const a = Float32Array.from([1, 2]);
  const b = Float32Array.from([3, 6]);
  assert.deepEqual(weightedMean([a, b], [1, 3]), Float32Array.from([2.5, 5]));
  const out = a;
  weightedMean([a, b], undefined, out);
  assert.deepEqual(out, Float32Array.from([2, 4]));
});

test('median: odd and even R against a sort-based reference', () => {
  for (let R = 1; R <= 9; R++) {
    const s = slicesOf(R, 777, 20 + R);
    const want = reference(s, (v) => {
      const x = sorted(v);
      const m = x.length >> 1;
      return x.length % 2 ? x[m] : (x[m - 1] + x[m]) / 2;
    });
    assert.deepEqual(median(s), want, `R=${R}`);
    assert.deepEqual(aggregate(s, { method: 'median' }), want);
  }
  // hand values
  const cols = [
    [1, 5, -3],
    [2, 2, 2],
    [100, -100, 0],
    [4, 1, 3],
  ].map((c) => Float32Array.from(c));
  assert.deepEqual(median(cols), Float32Array.from([3, 1.5, 1]));
  assert.deepEqual(median(cols.slice(0, 3)), Float32Array.from([2, 2, 0]));
});

test('trimmedMean: drops floor(trim * R) at each end; mean for R <= 2 or k = 0', () => {
  for (let R = 1; R <= 10; R++) {
    for (const trim of [0, 0.1, 0.2, 0.25, 0.4]) {
      const s = slicesOf(R, 301, 40 + R);
      const k = R <= 2 ? 0 : Math.floor(trim * R);
      const want = reference(s, (v) => mean(sorted(v).slice(k, v.length - k)));
      assert.deepEqual(trimmedMean(s, trim), want, `R=${R} trim=${trim}`);
      assert.deepEqual(aggregate(s, { method: 'trimmed-mean', trim }), want);
    }
  }
  // R = 5, trim 0.2: one outlier on each side is dropped
  const cols = [1, 2, 3, 1000, -1000].map((v) => Float32Array.from([v]));
  assert.deepEqual(trimmedMean(cols), Float32Array.from([2]));
  // R = 2 falls back to the mean
  assert.deepEqual(trimmedMean([Float32Array.from([1]), Float32Array.from([5])], 0.4), Float32Array.from([3]));
  expectMergeError(() => trimmedMean(cols, 0.5), 'bad_argument');
  expectMergeError(() => trimmedMean(cols, -0.1), 'bad_argument');
  expectMergeError(() => trimmedMean(cols, NaN), 'bad_argument');
});

test('signedGeometricMean: sign of the sum, geometric mean of the agreeing magnitudes', () => {
  const col = (...v: number[]): Float32Array[] => v.map((x) => Float32Array.from([x]));
  const one = (s: Float32Array[]): number => signedGeometricMean(s)[0];
  assert.equal(one(col(2, 8)), 4);
  assert.equal(one(col(-2, -8)), -4);
  assert.equal(one(col(2, 8, -1)), 4); // sum 9 > 0: geometric mean of 2 and 8
  assert.equal(one(col(-2, -8, 1)), -4);
  assert.equal(one(col(1, 1, -5)), -5); // sum -3 < 0: the only negative value, exactly
  assert.equal(one(col(3, -3)), 0); // tie
  assert.equal(one(col(0, 0, 0)), 0);
  assert.equal(one(col(0, 4, 0)), 4); // zeros never agree
  assert.equal(one(col(Math.fround(0.1))), Math.fround(0.1)); // R = 1 is the identity
  assert.ok(Math.abs(one(col(1, 10, 100)) - 10) < 1e-5);
  for (const R of [1, 2, 3, 4, 7]) {
    const s = slicesOf(R, 400, 60 + R);
    const want = reference(s, (v) => {
      const sum = v.reduce((a, x) => a + x, 0);
      if (sum === 0) return 0;
      const agree = v.filter((x) => Math.sign(x) === Math.sign(sum));
      return Math.sign(sum) * Math.exp(mean(agree.map((x) => Math.log(Math.abs(x)))));
    });
    const got = signedGeometricMean(s);
    for (let i = 0; i < got.length; i++) assert.ok(Math.abs(got[i] - want[i]) <= 1e-6 * Math.abs(want[i]), `R=${R} i=${i}: ${got[i]} vs ${want[i]}`);
    assert.deepEqual(aggregate(s, { method: 'signed-geometric-mean' }), got);
  }
});

test('every aggregator of identical slices returns that slice; results do not depend on the out buffer', () => {
  const x = randomVector(256, 9, 3);
  for (const method of AGGREGATORS) {
    for (const R of [1, 2, 3, 5]) {
      const got = aggregate(Array.from({ length: R }, () => x), { method });
      for (let i = 0; i < x.length; i++) assert.ok(Math.abs(got[i] - x[i]) <= 1e-6 * Math.abs(x[i]), `${method} R=${R}`);
    }
  }
});

test('MergeError: no slices, length mismatch, non-finite values, bad weights, bad out, unknown method', () => {
  const a = Float32Array.from([1, 2, 3]);
  const b = Float32Array.from([1, 2, 3]);
  for (const method of AGGREGATORS) {
    expectMergeError(() => aggregate([], { method }), 'no_replicas');
    expectMergeError(() => aggregate([a, Float32Array.from([1, 2])], { method }), 'length_mismatch');
    expectMergeError(() => aggregate([a, Float32Array.from([1, NaN, 3])], { method }), 'non_finite');
    expectMergeError(() => aggregate([a, Float32Array.from([1, 2, -Infinity])], { method }), 'non_finite');
    expectMergeError(() => aggregate([a, b], { method }, new Float32Array(4)), 'length_mismatch');
  }
  expectMergeError(() => weightedMean([a, b], [1]), 'length_mismatch');
  expectMergeError(() => weightedMean([a, b], [1, -1]), 'bad_weights');
  expectMergeError(() => weightedMean([a, b], [0, 0]), 'bad_weights');
  expectMergeError(() => weightedMean([a, b], [1, NaN]), 'bad_weights');
  expectMergeError(() => weightedMean([a, b], [1, Infinity]), 'bad_weights');
  expectMergeError(() => weightedMean([a, b], [Number.MAX_VALUE, Number.MAX_VALUE]), 'bad_weights');
  expectMergeError(() => weightedMean([a, [1, 2, 3] as unknown as Float32Array]), 'bad_argument');
  expectMergeError(() => aggregate([a], { method: 'mode' as never }), 'bad_argument');
  const e = expectMergeError(() => weightedMean([a, b], [1, -2]), 'bad_weights');
  assert.ok(e instanceof MergeError && e.message.startsWith('merge bad_weights: weight 1 is -2'));
  assert.equal(e.status, 400);
});
