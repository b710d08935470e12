import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ErrorFeedback } from '../../src/protocol/error-feedback.ts';
import { fp32GradientBytesPerStep, mergeTrafficPerReplica, mergeTrafficRatio } from '../../src/merge/traffic.ts';
import { partitionVector } from '../../src/merge/partition.ts';
import { encodeMergedPartition, encodePseudoGradientPartitions, framesByteLength } from '../../src/merge/pseudo-gradient.ts';
import { expectMergeError, randomVector } from './helpers.ts';

const GPT_TINY_PARAMS = 867_072;
const REPLICA = `0x${'ab'.repeat(20)}`;

/** Real frame bytes of one round for gpt-tiny with R replicas and 2R partitions. */
function gptTinyFrameBytes(R: number): { F: number; G: number } {
  const n = GPT_TINY_PARAMS;
  const pg = randomVector(n, 1, 1e-3);
  const parts = partitionVector(n, 2 * R, 256);
  const meta = { run: 'run-0001', stage: 0, round: 17 };
  const F = framesByteLength(encodePseudoGradientPartitions(pg, parts, new ErrorFeedback(n, 256), { ...meta, replica: REPLICA }));
  const G = framesByteLength(parts.map((p) => encodeMergedPartition(pg.subarray(p.start, p.end), p, meta)));
  return { F, G };
}

test('traffic per replica per round: the butterfly formula', () => {
  const t = mergeTrafficPerReplica({ replicas: 4, redundancy: 2, pseudoGradientBytes: 1000, mergedBytes: 800 });
  assert.equal(t.uploadPseudoGradient, 1000);
  assert.equal(t.downloadAsMerger, (2 * 3 * 1000) / 4);
  assert.equal(t.uploadMerged, (2 * 800) / 4);
  assert.equal(t.downloadMerged, (2 * 800) / 4);
  assert.equal(t.total, 1000 + 1500 + 400 + 400);
  assert.equal(t.upload + t.download, t.total);
  // redundancy is capped at R; one replica exchanges nothing
  const two = mergeTrafficPerReplica({ replicas: 2, redundancy: 5, pseudoGradientBytes: 10, mergedBytes: 10 });
  assert.deepEqual([two.downloadAsMerger, two.uploadMerged, two.downloadMerged], [10, 10, 0]);
  assert.equal(mergeTrafficPerReplica({ replicas: 1, pseudoGradientBytes: 10, mergedBytes: 10 }).total, 0);
  assert.equal(fp32GradientBytesPerStep(GPT_TINY_PARAMS), 4 * GPT_TINY_PARAMS);
  expectMergeError(() => mergeTrafficPerReplica({ replicas: 0, pseudoGradientBytes: 1, mergedBytes: 1 }), 'bad_argument');
  expectMergeError(() => mergeTrafficPerReplica({ replicas: 2, pseudoGradientBytes: -1, mergedBytes: 1 }), 'bad_argument');
  expectMergeError(() => mergeTrafficRatio({ params: 10, innerSteps: 0, replicas: 2, pseudoGradientBytes: 1, mergedBytes: 1 }), 'bad_argument');
});

test('network.merge_compression for gpt-tiny (867,072 params): >= 100 at H = 100, ~56 at H = 50 with R = 4', () => {
  for (const R of [2, 4, 8]) {
    const { F, G } = gptTinyFrameBytes(R);
    // int8-block 256: 1 + 4/256 bytes per parameter plus a few hundred header bytes per frame
    assert.ok(F / GPT_TINY_PARAMS > 1.0156 && F / GPT_TINY_PARAMS < 1.03, `F = ${F / GPT_TINY_PARAMS} bytes/param`);
    const at = (H: number): number => mergeTrafficRatio({ params: GPT_TINY_PARAMS, innerSteps: H, replicas: R, pseudoGradientBytes: F, mergedBytes: G }).ratio;
    assert.ok(at(100) >= 100, `R=${R} H=100: ${at(100)}`);
    assert.ok(Math.abs(at(100) - 2 * at(50)) < 1e-9 * at(100), 'the ratio is linear in H');
    // the ceiling: even a replica that only uploaded its int8 pseudo-gradient and downloaded the
    // int8 merged Δ (no merging work) would reach 4·params·H / (F + G) < 2H
    const ceiling = (4 * GPT_TINY_PARAMS * 50) / (F + G);
    assert.ok(at(50) < ceiling && ceiling < 100, `R=${R} H=50: ${at(50)}, ceiling ${ceiling}`);
  }
  const { F, G } = gptTinyFrameBytes(4);
  const c = mergeTrafficRatio({ params: GPT_TINY_PARAMS, innerSteps: 50, replicas: 4, pseudoGradientBytes: F, mergedBytes: G });
  assert.ok(c.ratio > 55 && c.ratio < 57, `R=4 H=50: ${c.ratio}`);
  assert.equal(c.fp32BytesPerStep, 4 * GPT_TINY_PARAMS);
  assert.equal(c.mergeBytesPerStep, c.traffic.total / 50);
});
