// End to end: replicas of one stage train a toy quadratic with local SGD and
// merge every H steps through the real frames, partitions, mergers,
// aggregators and outer optimizer; one replica vanishes, one joins late.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ErrorFeedback } from '../../src/protocol/error-feedback.ts';
import { decodeFrame, encodeFrame } from '../../src/protocol/frame.ts';
import { aggregate, type AggregatorName } from '../../src/merge/aggregate.ts';
import { createOuterState, outerStep, type OuterState } from '../../src/merge/outer.ts';
import { assignMergers, partitionVector, reassign, type Partition } from '../../src/merge/partition.ts';
import {
  decodePartitionFrame,
  decodePartitionFrames,
  encodeMergedPartition,
  encodePseudoGradientPartitions,
  pseudoGradient,
} from '../../src/merge/pseudo-gradient.ts';
import { bitwiseEqual, rng } from './helpers.ts';

const N = 4 * 256 + 100; // a short last block
const BLOCK = 256;
const H = 10;
const INNER_LR = 0.05;

interface Replica {
  id: string;
  theta: Float32Array;
  state: OuterState;
  feedback: ErrorFeedback;
  samples: number;
  noise: () => number;
}

/** The task: ½ Σ a_j (θ_j − c_j)²; each replica sees a shifted target (its data) plus gradient noise. */
const curvature = Float32Array.from({ length: N }, (_, j) => 0.5 + 1.5 * ((j * 7919) % 97) / 97);
const target = Float32Array.from({ length: N }, (_, j) => Math.sin(j * 0.1) * 2);

function loss(theta: Float32Array): number {
  let s = 0;
  for (let j = 0; j < N; j++) s += 0.5 * curvature[j] * (theta[j] - target[j]) ** 2;
  return s / N;
}

function localSteps(r: Replica, shift: number): void {
  for (let step = 0; step < H; step++) {
    for (let j = 0; j < N; j++) {
      const grad = curvature[j] * (r.theta[j] - target[j] - shift) + 0.3 * (r.noise() * 2 - 1);
      r.theta[j] -= INNER_LR * grad;
    }
  }
}

function newReplica(id: string, seed: number, theta: Float32Array, state: OuterState): Replica {
  return { id, theta, state, feedback: new ErrorFeedback(N, BLOCK), samples: 8 + (seed % 3) * 4, noise: rng(seed) };
}

/**
 * One merge round for `replicas` (everyone alive uploads); the mergers of each
 * partition are `assignment[p]`. Returns the merged frames the replicas download.
 */
function mergeRound(replicas: Replica[], thetaStart: Float32Array, parts: Partition[], assignment: readonly (readonly string[])[], round: number, method: AggregatorName): Uint8Array[] {
  const byId = [...replicas].sort((a, b) => (a.id < b.id ? -1 : 1)); // canonical order
  const uploads = new Map<string, Uint8Array[]>();
  for (const r of byId) {
    const pg = pseudoGradient(thetaStart, r.theta);
    uploads.set(r.id, encodePseudoGradientPartitions(pg, parts, r.feedback, { stage: 0, round, replica: r.id }));
  }
  return parts.map((p) => {
    const mergers = assignment[p.index];
    assert.ok(mergers.length >= 1);
    const results = mergers.map((merger) => {
      assert.ok(uploads.has(merger), `merger ${merger} of partition ${p.index} is not a live replica`);
      const slices = byId.map((r) => decodePartitionFrame(uploads.get(r.id)![p.index], p));
      const merged = aggregate(slices, method === 'mean' ? { method, weights: byId.map((r) => r.samples) } : { method });
      return encodeMergedPartition(merged, p, { stage: 0, round });
    });
    // redundancy: both mergers computed the same bytes, so either copy (or a hash check) will do
    for (const other of results) assert.ok(Buffer.from(other).equals(Buffer.from(results[0])), `mergers of partition ${p.index} disagree`);
    return results[0];
  });
}

function simulate(method: AggregatorName): { losses: number[] } {
  const init = Float32Array.from({ length: N }, (_, j) => Math.cos(j) * 3);
  const parts = partitionVector(N, 5, BLOCK);
  let replicas = ['0xa1', '0xb2', '0xc3', '0xd4'].map((id, k) => newReplica(id, k + 1, init.slice(), createOuterState(N)));
  let thetaStart = init.slice();
  const losses = [loss(thetaStart)];
  for (let round = 1; round <= 12; round++) {
    replicas.forEach((r, k) => localSteps(r, 0.2 * (k - 1.5)));
    let assignment = assignMergers(parts.length, replicas.map((r) => r.id), 2, round);
    if (round === 5) {
      // replica 0xb2 vanishes after local training: it neither uploads nor merges; its partitions move
      const vanished = new Set(['0xb2']);
      replicas = replicas.filter((r) => !vanished.has(r.id));
      assignment = reassign(assignment, vanished, replicas.map((r) => r.id));
    }
    const merged = mergeRound(replicas, thetaStart, parts, assignment, round, method);
    for (const r of replicas) {
      const delta = decodePartitionFrames(merged, parts);
      r.theta = outerStep(r.state, thetaStart, delta);
    }
    thetaStart = replicas[0].theta.slice();
    for (const r of replicas) {
      assert.ok(bitwiseEqual(r.theta, thetaStart), `${method}: replica ${r.id} diverged after round ${round}`);
      assert.ok(bitwiseEqual(r.state.momentumBuffer, replicas[0].state.momentumBuffer));
      assert.equal(r.state.step, round);
    }
    if (round === 8) {
      // a late joiner downloads the weights and the outer momentum and step (a miner
      // gets them in the stage's saved state), then trains in lockstep
      const weights = decodeFrame(encodeFrame(thetaStart, [N], 'f32')).data;
      const { lr, momentum, step, momentumBuffer } = replicas[0].state;
      const state: OuterState = { lr, momentum, step, momentumBuffer: decodeFrame(encodeFrame(momentumBuffer, [N], 'f32')).data };
      replicas.push(newReplica('0xe5', 99, weights, state));
    }
    losses.push(loss(thetaStart));
  }
  return { losses };
}

for (const method of ['mean', 'median', 'trimmed-mean', 'signed-geometric-mean'] as const) {
  test(`4 replicas on a quadratic (${method}): loss falls, replicas identical after every merge, survive a vanish and a late join`, () => {
    const { losses } = simulate(method);
    const first = losses[0];
    const last = losses[losses.length - 1];
    assert.ok(last < 0.05 * first, `${method}: loss ${first} -> ${last} (${losses.map((l) => l.toFixed(4)).join(' ')})`);
    assert.ok(losses[3] < 0.5 * first, `${method}: slow start ${losses.map((l) => l.toFixed(4)).join(' ')}`);
  });
}
