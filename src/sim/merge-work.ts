// A merge round's compute on one thread of this machine (docs/simulation.md,
// "Calibration"), per value, measured the way the engine's jobs are
// (calibrate.ts measureEngine): a short microbenchmark of the very functions
// a round runs, on each stage of a local network's run, after two trained
// microbatches so that the pseudo-gradient is a real one:
//   - a replica: its pseudo-gradient's int8 frames (src/miner/merge-round.ts
//     pseudoGradientFrames), a merger's partitions of two replicas' frames
//     (mergePartition), decoding the merged partitions and the outer step
//     (decodeMergedDelta, StageRunner.applyOuterStep);
//   - the orchestrator: an upload's check (its checksum and scales, AdamW's
//     reach of 2 steps read from the codes, src/orchestrator/training/merge-checks.ts
//     sliceReach, and its blob id), a merged
//     partition's decoding, and a merged state's writing (its partitions
//     read back, the outer step, the checkpoint encoded and named).
// Medians of `reps` after a warm-up, in ms per value, over the stages.
import { loadCorpus } from '../data/corpus.ts';
import { Engine } from '../engine/engine.ts';
import { createOuterState, DEFAULT_OUTER_LR, DEFAULT_OUTER_MOMENTUM, outerStep } from '../merge/outer.ts';
import { partitionVector } from '../merge/partition.ts';
import { decodePartitionFrame, readPartitionInt8 } from '../merge/pseudo-gradient.ts';
import { decodeMergedDelta, mergePartition, pseudoGradientFrames } from '../miner/merge-round.ts';
import { StageRunner } from '../miner/stage-runner.ts';
import { blobId } from '../orchestrator/blobs/blobs.ts';
import { FEEDBACK_STEPS, sliceReach } from '../orchestrator/training/merge-checks.ts';
import { calibrationFrames, calibrationStage, localStages, stageJobs, type LocalNetwork } from './calibrate.ts';
import { mergePartitions } from './costs.ts';
import type { MergeWork } from './merge-time.ts';

const MERGED_CODECS = { codecs: ['int8-block', 'f16', 'f32'] as ('int8-block' | 'f16' | 'f32')[] };

/** Median wall ms of `f` over `reps` runs after one warm-up. */
async function timed(reps: number, f: () => unknown): Promise<number> {
  const xs: number[] = [];
  for (let k = 0; k <= reps; k++) {
    const t0 = performance.now();
    await f();
    if (k > 0) xs.push(performance.now() - t0);
  }
  return xs.sort((a, b) => a - b)[xs.length >> 1];
}

/** A merge round's compute per value on one thread, for the stages of `net`'s run with two replicas each. */
export async function measureMergeWork(net: LocalNetwork, reps = 5): Promise<MergeWork> {
  const io = calibrationFrames(net);
  const engine = await Engine.create({ threads: 1 });
  const corpus = loadCorpus('moby-dick');
  const sums: MergeWork = { uploadMsPerParam: 0, mergeMsPerParam: 0, applyMsPerParam: 0, checkMsPerParam: 0, mergedMsPerParam: 0, writeMsPerParam: 0 };
  const stages = localStages(net).length;
  try {
    for (let s = 0; s < stages; s++) {
      const runner = new StageRunner(engine, calibrationStage(net, s), 1, corpus);
      await runner.ready();
      for (let k = 0; k < 2; k++) await stageJobs(runner, k, io);
      const n = runner.paramCount;
      const parts = partitionVector(n, mergePartitions(n, 2));
      const at = { runId: 'calibration', stage: s, round: 1 };
      // as if every value took weight decay (a real stage's biases and gains do not): the arithmetic per value is the same
      const start = { weights: await runner.readWeights(), decaySize: n };
      let frames: Uint8Array[] = [];
      const upload = await timed(reps, async () => (frames = await pseudoGradientFrames(runner, parts, at)));
      const check = await timed(reps, () => {
        for (let p = 0; p < parts.length; p++) {
          sliceReach(readPartitionInt8(frames[p], parts[p]), parts[p], start, 2 + FEEDBACK_STEPS, 1e-3);
          blobId(frames[p]);
        }
      });
      let merged: Uint8Array[] = [];
      const rule = { aggregator: 'mean' as const, trim: 0, maxNorm: null };
      const merge = await timed(reps, () => {
        merged = parts.map((p, i) => mergePartition([0, 1].map((r) => ({ minerId: `m${r}`, samples: 2, slice: decodePartitionFrame(frames[i], p) })), rule, p, at));
      });
      const decodeMerged = await timed(reps, () => parts.forEach((p, i) => (decodePartitionFrame(merged[i], p, MERGED_CODECS), blobId(merged[i]))));
      const apply = await timed(reps, () => runner.applyOuterStep(decodeMergedDelta(merged, parts), 1, DEFAULT_OUTER_LR, DEFAULT_OUTER_MOMENTUM));
      const write = await timed(reps, async () => {
        for (const f of merged) blobId(f);
        const delta = decodeMergedDelta(merged, parts);
        outerStep(createOuterState(n, { lr: DEFAULT_OUTER_LR, momentum: DEFAULT_OUTER_MOMENTUM }), start.weights, delta);
        blobId(await runner.encodeState(1));
      });
      runner.dispose();
      sums.uploadMsPerParam += upload / n;
      sums.checkMsPerParam += check / n;
      sums.mergeMsPerParam += merge / (2 * n);
      sums.mergedMsPerParam += decodeMerged / n;
      sums.applyMsPerParam += apply / n;
      sums.writeMsPerParam += write / n;
    }
  } finally {
    await engine.close();
  }
  for (const key of Object.keys(sums) as (keyof MergeWork)[]) sums[key] /= stages;
  return sums;
}
