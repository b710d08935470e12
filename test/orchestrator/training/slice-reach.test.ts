// The orchestrator's check of an uploaded pseudo-gradient slice
// (src/orchestrator/training/merge-checks.ts sliceReach), read from the int8 codes with
// whole blocks passed at once when they cannot hold a value out of reach:
// it must find exactly what a check of every dequantized value against its
// own weight's AdamW bound finds (the first value out of reach, or the norm).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { adamMoveBound, ADAMW_DEFAULTS } from '../../../src/model/adamw.ts';
import { mulberry32 } from '../../../src/model/init.ts';
import { decodePartitionFrame, encodePseudoGradientPartitions, readPartitionInt8 } from '../../../src/merge/pseudo-gradient.ts';
import { sliceReach } from '../../../src/orchestrator/training/merge-checks.ts';
import { ErrorFeedback } from '../../../src/protocol/error-feedback.ts';
import { FrameError } from '../../../src/protocol/errors.ts';
import { encodeFrame } from '../../../src/protocol/frame.ts';
import type { Partition } from '../../../src/merge/partition.ts';

const LR = 1e-3;
const STEPS = 5;

/** The check as it reads without shortcuts: every dequantized value against its weight's bound. */
function reference(slice: Float32Array, p: Partition, weights: Float32Array, decaySize: number): { norm: number } | { at: number } {
  let norm2 = 0;
  for (let i = 0; i < slice.length; i++) {
    const at = p.start + i;
    const bound = adamMoveBound(weights[at], STEPS, LR, at < decaySize ? ADAMW_DEFAULTS.weightDecay : 0) * 1.01 + 1e-6;
    if (!(Math.abs(slice[i]) <= bound)) return { at };
    norm2 += slice[i] * slice[i];
  }
  return { norm: Math.sqrt(norm2) };
}

/** A partition's frame of `values` (int8 blocks of 256), as a replica uploads it. */
function frameOf(values: Float32Array, p: Partition): Uint8Array {
  const whole = new Float32Array(p.end);
  whole.set(values, p.start);
  const parts = [{ index: 0, start: 0, end: p.start }, p].filter((q) => q.end > q.start);
  const frames = encodePseudoGradientPartitions(whole, parts, new ErrorFeedback(p.end, 256), { runId: 'r', stage: 0, round: 1 });
  return frames[frames.length - 1];
}

test('sliceReach finds what a check of every value finds: honest slices, values just out of a weight-decayed or plain weight reach, at block edges', () => {
  const rng = mulberry32(7);
  const p: Partition = { index: 1, start: 1024, end: 1024 + 256 * 12 + 77 };
  const n = p.end - p.start;
  // weights up to 30 in size, so a decayed weight's bound is several times the plain bound
  const weights = new Float32Array(p.end).map(() => (rng() - 0.5) * 60);
  const decaySize = p.start + 256 * 6 + 13;
  const boundAt = (at: number): number => adamMoveBound(weights[at], STEPS, LR, at < decaySize ? ADAMW_DEFAULTS.weightDecay : 0) * 1.01 + 1e-6;
  let outsideCases = 0;
  for (let trial = 0; trial < 60; trial++) {
    // honest: every value well inside its bound, some blocks close to it
    const values = new Float32Array(n).map((_, i) => (rng() - 0.5) * boundAt(p.start + i) * (trial % 3 === 0 ? 1.9 : 0.5));
    if (trial % 2 === 1) {
      // one value a little past its own bound, at a random place (block starts and ends included)
      const i = trial % 4 === 1 ? Math.floor(rng() * n) : [0, 255, 256, n - 1, decaySize - p.start - 1, decaySize - p.start][trial % 6];
      values[i] = (rng() < 0.5 ? -1 : 1) * boundAt(p.start + i) * 1.03;
    }
    const frame = frameOf(values, p);
    const decoded = decodePartitionFrame(frame, p);
    const want = reference(decoded, p, weights, decaySize);
    const got = sliceReach(readPartitionInt8(frame, p), p, { weights, decaySize }, STEPS, LR);
    if ('at' in want) {
      outsideCases++;
      assert.ok('outside' in got, `trial ${trial}: value ${want.at} is out of reach`);
      assert.equal(got.outside.at, want.at);
      assert.equal(got.outside.value, decoded[want.at - p.start]);
    } else {
      assert.ok('norm' in got, `trial ${trial}: nothing is out of reach`);
      assert.ok(Math.abs(got.norm - want.norm) <= 1e-6 * want.norm, `trial ${trial}: norm ${got.norm} vs ${want.norm}`);
    }
  }
  assert.ok(outsideCases >= 25, `${outsideCases} slices had a value out of reach`);
});

test('sliceReach: the codes of a crafted block (−128, the largest scale) are each held against their bound; a frame that is not an int8 block frame of the partition is refused', () => {
  const p: Partition = { index: 0, start: 0, end: 512 };
  const weights = new Float32Array(512);
  const plain = adamMoveBound(0, STEPS, LR, 0) * 1.01 + 1e-6;
  // every value exactly at the plain bound: passes; the same with one code at −128 (beyond 127 × scale): refused
  const values = new Float32Array(512).fill(plain);
  const frame = frameOf(values, p);
  assert.ok('norm' in sliceReach(readPartitionInt8(frame, p), p, { weights, decaySize: 0 }, STEPS, LR));
  const q = readPartitionInt8(frame.slice(), p);
  q.codes[300] = -128;
  const got = sliceReach(q, p, { weights, decaySize: 0 }, STEPS, LR);
  assert.ok('outside' in got && got.outside.at === 300, JSON.stringify(got));
  // f32 frames, another partition's frame, a changed payload: refused before any value is read
  assert.throws(() => readPartitionInt8(encodeFrame(values, [512], 'f32', { partition: 0, start: 0, end: 512 }), p), (e: unknown) => e instanceof FrameError && e.code === 'bad_codec');
  assert.throws(() => readPartitionInt8(frame, { index: 1, start: 0, end: 512 }), /expected 1 \[0, 512\)/);
  const flipped = frame.slice();
  flipped[flipped.length - 1] ^= 1;
  assert.throws(() => readPartitionInt8(flipped, p), (e: unknown) => e instanceof FrameError && e.code === 'checksum');
});
