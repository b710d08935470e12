import { test } from 'node:test';
import assert from 'node:assert/strict';
import { dequantize, dequantizeInt8, quantize, quantizeInt8 } from '../../src/protocol/int8.ts';
import { ErrorFeedback } from '../../src/protocol/error-feedback.ts';
import { mulberry32 } from '../../src/model/init.ts';

const rng = mulberry32;

/** Random vector whose groups of `group` values have very different magnitudes. */
function randomVector(n: number, group: number, seed: number): Float32Array {
  const r = rng(seed);
  const x = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const magnitude = 10 ** (((Math.floor(i / group) * 7) % 13) - 6);
    x[i] = (r() * 2 - 1) * magnitude;
  }
  return x;
}

/** Largest |x - y| / scale over all values, with scale of each value's group. */
function maxErrorInScales(x: Float32Array, y: Float32Array, scales: Float32Array, group: number): number {
  let worst = 0;
  for (let i = 0; i < x.length; i++) {
    const s = scales[Math.floor(i / group)];
    const err = Math.abs(x[i] - y[i]);
    worst = Math.max(worst, s === 0 ? (err === 0 ? 0 : Infinity) : err / s);
  }
  return worst;
}

const SLACK = 1 + 1e-5; // float32 rounding of the dequantized product

test('per-row int8: error <= scale/2 in every row, scale = absmax/127', () => {
  const rows = 64;
  const cols = 300;
  const x = randomVector(rows * cols, cols, 2);
  const q = quantize(x, cols);
  assert.equal(q.scales.length, rows);
  for (let r = 0; r < rows; r++) {
    let absmax = 0;
    for (let c = 0; c < cols; c++) absmax = Math.max(absmax, Math.abs(x[r * cols + c]));
    assert.equal(q.scales[r], Math.fround(absmax / 127));
  }
  const y = dequantize(q, cols);
  const worst = maxErrorInScales(x, y, q.scales, cols);
  assert.ok(worst <= 0.5 * SLACK, `worst error ${worst} scales`);
  for (const c of q.codes) assert.ok(c >= -127 && c <= 127);
});

test('per-block int8 with a short last block: error <= scale/2', () => {
  const block = 256;
  const n = 10 * block + 77;
  const x = randomVector(n, block, 3);
  const q = quantize(x, block);
  assert.equal(q.scales.length, 11);
  const y = dequantize(q, block);
  const worst = maxErrorInScales(x, y, q.scales, block);
  assert.ok(worst <= 0.5 * SLACK, `worst error ${worst} scales`);
});

test('all-zero groups get scale 0 and decode to exact zeros; absmax values are exact', () => {
  const x = new Float32Array([0, 0, 0, 0, 1, -2, 0.5, 2]);
  const scales = new Float32Array(2);
  const codes = new Int8Array(8);
  quantizeInt8(x, 4, scales, codes);
  assert.equal(scales[0], 0);
  assert.deepEqual([...codes.subarray(0, 4)], [0, 0, 0, 0]);
  assert.deepEqual([...codes.subarray(4)], [64, -127, 32, 127]);
  const y = new Float32Array(8);
  dequantizeInt8(scales, codes, 4, y);
  assert.deepEqual([...y.subarray(0, 4)], [0, 0, 0, 0]);
  assert.ok(Math.abs(y[5] + 2) < 1e-6 && Math.abs(y[7] - 2) < 1e-6);
});

test('quantizeInt8 checks buffer sizes and group size', () => {
  assert.throws(() => quantizeInt8(new Float32Array(10), 4, new Float32Array(2), new Int8Array(10)), RangeError);
  assert.throws(() => quantizeInt8(new Float32Array(10), 4, new Float32Array(3), new Int8Array(9)), RangeError);
  assert.throws(() => quantize(new Float32Array(10), 0), RangeError);
});

test('error feedback: residual stays <= scale/2 and nothing is lost over rounds', () => {
  const n = 1000;
  const block = 64;
  const ef = new ErrorFeedback(n, block);
  const r = rng(4);
  const sumX = new Float64Array(n);
  const sumQ = new Float64Array(n);
  for (let round = 0; round < 20; round++) {
    const x = new Float32Array(n);
    for (let i = 0; i < n; i++) x[i] = (r() * 2 - 1) * 1e-3;
    const q = ef.compress(x);
    const y = dequantize(q, block);
    for (let i = 0; i < n; i++) {
      sumX[i] += x[i];
      sumQ[i] += y[i];
      const s = q.scales[Math.floor(i / block)];
      assert.ok(Math.abs(ef.residual[i]) <= 0.5 * s * SLACK + 1e-12, 'residual within half a step');
    }
  }
  // telescoping: sum of what was sent + final residual = sum of inputs
  let worst = 0;
  for (let i = 0; i < n; i++) worst = Math.max(worst, Math.abs(sumQ[i] + ef.residual[i] - sumX[i]));
  assert.ok(worst < 1e-8, `drift ${worst}`);
  ef.reset();
  assert.ok(ef.residual.every((v) => v === 0));
});

test('tiny (subnormal) scales never wrap codes past +-127', () => {
  const x = new Float32Array([1e-39, -1e-39, 3e-40, 1e-44]);
  const q = quantize(x, 4);
  for (const c of q.codes) assert.ok(c >= -127 && c <= 127, `code ${c}`);
  assert.ok(q.codes[0] > 100 && q.codes[1] < -100);
});
