import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ErrorFeedback } from '../../src/protocol/error-feedback.ts';
import { decodeFrame, encodeFrame } from '../../src/protocol/frame.ts';
import { FrameError } from '../../src/protocol/errors.ts';
import { quantize } from '../../src/protocol/int8.ts';
import { partitionVector } from '../../src/merge/partition.ts';
import {
  bytesPerParameter,
  decodePartitionFrame,
  decodePartitionFrames,
  encodeMergedPartition,
  encodePseudoGradientPartitions,
  pseudoGradient,
} from '../../src/merge/pseudo-gradient.ts';
import { expectMergeError, randomVector } from './helpers.ts';

const BLOCK = 256;

test('pseudoGradient = start - current, in place allowed', () => {
  const start = Float32Array.from([1, 2, 3.5, -1]);
  const current = Float32Array.from([0.5, 2, 4, 1]);
  assert.deepEqual(pseudoGradient(start, current), Float32Array.from([0.5, 0, -0.5, -2]));
  const out = start.slice();
  pseudoGradient(out, current, out);
  assert.deepEqual(out, Float32Array.from([0.5, 0, -0.5, -2]));
  expectMergeError(() => pseudoGradient(start, new Float32Array(3)), 'length_mismatch');
  expectMergeError(() => pseudoGradient(start, current, new Float32Array(5)), 'length_mismatch');
});

test('partition frames round-trip within the int8 bound and match whole-vector quantization exactly', () => {
  const n = 10 * BLOCK + 77;
  const pg = randomVector(n, 1, 0.01);
  // very different magnitudes per block
  for (let i = 0; i < n; i++) pg[i] *= 10 ** ((Math.floor(i / BLOCK) % 5) - 2);
  const parts = partitionVector(n, 4, BLOCK);
  const ef = new ErrorFeedback(n, BLOCK);
  const frames = encodePseudoGradientPartitions(pg, parts, ef, { run: 'r1', stage: 0, replica: 'a', round: 1 });
  assert.equal(frames.length, 4);
  const decoded = decodePartitionFrames(frames, parts);
  const whole = quantize(pg, BLOCK); // first round: residual was zero, so frames = plain quantization
  for (let i = 0; i < n; i++) {
    const scale = whole.scales[Math.floor(i / BLOCK)];
    assert.equal(decoded[i], Math.fround(whole.codes[i] * scale), `value ${i}`);
    assert.ok(Math.abs(pg[i] - decoded[i]) <= (scale / 2) * (1 + 1e-5), `value ${i} error beyond scale/2`);
    // the residual holds exactly what was dropped
    assert.ok(Math.abs(pg[i] - decoded[i] - ef.residual[i]) <= 1e-6 * Math.abs(pg[i]) + 1e-12);
  }
  for (const [i, p] of parts.entries()) {
    const f = decodeFrame(frames[i]);
    assert.deepEqual(f.shape, [p.end - p.start]);
    assert.equal(f.codec, 'int8-block');
    assert.equal(f.blockSize, BLOCK);
    assert.deepEqual(f.meta, { run: 'r1', stage: 0, replica: 'a', round: 1, partition: i, start: p.start, end: p.start + f.shape[0] });
    // a partition decodes on its own
    const alone = decodePartitionFrame(frames[i], p);
    assert.deepEqual(alone, decoded.subarray(p.start, p.end));
  }
});

test('error feedback over 20 rounds: the cumulative error stays bounded (does not grow)', () => {
  const n = 8 * BLOCK;
  const parts = partitionVector(n, 3, BLOCK);
  const ef = new ErrorFeedback(n, BLOCK);
  const noEf: Float32Array[] = [];
  const sentSum = new Float64Array(n);
  const trueSum = new Float64Array(n);
  const plainSum = new Float64Array(n);
  const errors: number[] = [];
  const plainErrors: number[] = [];
  for (let round = 0; round < 20; round++) {
    // a biased signal: a constant drift plus noise, as pseudo-gradients are
    const pg = randomVector(n, 100 + round, 0.001);
    for (let i = 0; i < n; i++) pg[i] += 0.0003 * Math.sin(i);
    const sent = decodePartitionFrames(encodePseudoGradientPartitions(pg, parts, ef), parts);
    const plain = decodeFrame(encodeFrame(pg, [n], 'int8-block', undefined, { blockSize: BLOCK })).data;
    noEf.push(plain);
    let err = 0;
    let plainErr = 0;
    for (let i = 0; i < n; i++) {
      trueSum[i] += pg[i];
      sentSum[i] += sent[i];
      plainSum[i] += plain[i];
      err = Math.max(err, Math.abs(trueSum[i] - sentSum[i]));
      plainErr = Math.max(plainErr, Math.abs(trueSum[i] - plainSum[i]));
      // invariant: what was sent + the residual = what was produced
      assert.ok(Math.abs(trueSum[i] - sentSum[i] - ef.residual[i]) < 1e-8, `round ${round} value ${i}`);
    }
    errors.push(err);
    plainErrors.push(plainErr);
  }
  // the cumulative error is the current residual: within half a scale (~absmax/254) every round
  const bound = (0.0013 / 127 / 2) * 1.5;
  for (const [round, e] of errors.entries()) assert.ok(e <= bound, `round ${round}: cumulative error ${e} > ${bound}`);
  assert.ok(errors[19] <= 2 * Math.max(...errors.slice(0, 5)), `error grows: ${errors[0]} -> ${errors[19]}`);
  // without error feedback the same signal drifts further
  assert.ok(plainErrors[19] > errors[19], `no-EF error ${plainErrors[19]} vs EF ${errors[19]}`);
});

test('bytes per parameter of int8-block partition frames', () => {
  const n = 867_072;
  const pg = randomVector(n, 3, 1e-3);
  for (const P of [1, 8, 64]) {
    const frames = encodePseudoGradientPartitions(pg, partitionVector(n, P, BLOCK), new ErrorFeedback(n, BLOCK), { run: 'run-0001', stage: 0, round: 12 });
    const bpp = bytesPerParameter(frames, n);
    assert.ok(bpp > 1 + 4 / BLOCK && bpp < 1 + 4 / BLOCK + (P * 400) / n, `P=${P}: ${bpp} bytes/param`);
  }
});

test('encode refuses misaligned partitions, wrong feedback size, NaN; decode checks the partition', () => {
  const n = 4 * BLOCK;
  const pg = randomVector(n, 4);
  const ef = new ErrorFeedback(n, BLOCK);
  expectMergeError(() => encodePseudoGradientPartitions(pg, [{ index: 0, start: 0, end: 100 }, { index: 1, start: 100, end: n }], ef), 'misaligned');
  expectMergeError(() => encodePseudoGradientPartitions(pg, partitionVector(n, 3, 64), new ErrorFeedback(n, 128)), 'misaligned');
  expectMergeError(() => encodePseudoGradientPartitions(pg, partitionVector(n, 2, BLOCK), new ErrorFeedback(n + 1, BLOCK)), 'length_mismatch');
  const bad = pg.slice();
  bad[7] = NaN;
  expectMergeError(() => encodePseudoGradientPartitions(bad, partitionVector(n, 2, BLOCK), ef), 'non_finite');
  assert.ok(ef.residual.every((v) => v === 0), 'a refused encode must not touch the residual');

  const parts = partitionVector(n, 2, BLOCK);
  const frames = encodePseudoGradientPartitions(pg, parts, ef);
  expectMergeError(() => decodePartitionFrame(frames[0], { index: 1, start: 0, end: 2 * BLOCK }), 'bad_frame');
  expectMergeError(() => decodePartitionFrame(frames[0], parts[1]), 'bad_frame'); // same size, other partition
  assert.throws(() => decodePartitionFrame(frames[0], { index: 0, start: 0, end: BLOCK }), FrameError); // shape differs
  const corrupt = frames[0].slice();
  corrupt[corrupt.length - 1] ^= 1;
  assert.throws(() => decodePartitionFrame(corrupt, parts[0]), FrameError);
  const f32 = encodeFrame(pg.subarray(0, 2 * BLOCK), [2 * BLOCK], 'f32', { partition: 0, start: 0, end: 2 * BLOCK });
  assert.throws(() => decodePartitionFrame(f32, parts[0]), FrameError); // codec not accepted by default
  assert.equal(decodePartitionFrame(f32, parts[0], { codecs: ['f32'] }).length, 2 * BLOCK);
  expectMergeError(() => decodePartitionFrames(frames.slice(0, 1), parts), 'length_mismatch');
});

test('merged partitions: encode, decode, every decoder gets the same bits', () => {
  const n = 3 * BLOCK + 5;
  const parts = partitionVector(n, 2, BLOCK);
  const merged = randomVector(parts[1].end - parts[1].start, 5, 0.01);
  const frame = encodeMergedPartition(merged, parts[1], { round: 3 });
  const a = decodePartitionFrame(frame, parts[1]);
  const b = decodePartitionFrame(frame.slice(), parts[1]);
  assert.deepEqual(a, b);
  for (let i = 0; i < merged.length; i++) assert.ok(Math.abs(a[i] - merged[i]) <= 0.01 / 127);
  const f16 = encodeMergedPartition(merged, parts[1], {}, 'f16');
  assert.ok(f16.length > frame.length);
  expectMergeError(() => encodeMergedPartition(merged, parts[0]), 'length_mismatch');
});
