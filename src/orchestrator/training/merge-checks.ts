// Checking what replicas send in a merge round, so that no replica can
// poison the merged model or take credit it did not earn:
//   - a pseudo-gradient slice: every value within what honest AdamW steps can
//     move a weight from the round's starting state (src/model/adamw.ts), for
//     no more steps than the replica was credited (with a little slack); its
//     weight in the mean is the steps it was credited, not the steps it claims;
//   - a merged partition: recomputed here (the same deterministic merge every
//     merger runs, src/merge/merge-partition.ts) when its mergers disagree or
//     only one delivered; the recomputed frame is what everyone applies;
//   - a stage state, uploaded only by a stage's single replica (no merge):
//     weights within AdamW's reach of the round's starting state, the outer
//     momentum unchanged. A merged round's state is not uploaded: the
//     orchestrator makes it (`mergedState`: the outer step of the chosen
//     partitions from the round's starting state, what every replica applies).
import { adamMoveBoundTerms, ADAMW_DEFAULTS, firstOutOfReach } from '../../model/adamw.ts';
import { mergeSlices } from '../../merge/merge-partition.ts';
import { createOuterState, outerStep } from '../../merge/outer.ts';
import { partitionVector, type Partition } from '../../merge/partition.ts';
import { decodePartitionFrame, decodePartitionFrames, encodeMergedPartition, readPartitionInt8 } from '../../merge/pseudo-gradient.ts';
import type { Int8Payload } from '../../protocol/codec.ts';
import { rangeParams } from '../../model/model-ref.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { OffenceError } from '../rewards/offences.ts';
import type { BlobStore } from '../blobs/blobs.ts';
import type { StageState, StageStates } from './stage-states.ts';
import type { OrchestratorState } from '../state/index.ts';
import type { MergeRoundRecord, RoundKey } from '../state/merge-rounds.ts';
import type { RunRecord, StageRecord } from '../state/runs.ts';

/** Steps a replica may have taken beyond those credited to it (microbatches whose later hops failed). */
export const UNCREDITED_STEPS_SLACK = 16;
/**
 * Reach added to every upload for the int8 error feedback it carries from
 * the replica's previous upload: that residual is at most half a quantization
 * step, 1/254 of its block's largest value, so at most 1/253 of the previous
 * round's reach (the feedback's own share included). 16 steps' reach covers
 * a previous round bounded at 2 × 1,000 + 16 steps for lr up to 1e-2 (weight
 * decay makes reach grow faster than the steps). Without it an honest
 * replica that took no step since (samples 0) fails on its own residual.
 */
export const FEEDBACK_STEPS = 16;
/** The miner id under which the orchestrator's own recomputation of a partition is stored. */
export const RECOMPUTED = 'orchestrator';

export class MergeChecks {
  constructor(
    private readonly state: OrchestratorState,
    private readonly blobs: BlobStore,
    private readonly stageStates: StageStates,
  ) {}

  partitions(run: RunRecord, s: StageRecord, count: number): Partition[] {
    return count === 0 ? [] : partitionVector(rangeParams(run.model, { from: s.fromPart, to: s.toPart }), count);
  }

  /** The inner steps a replica of stage `k.stage` was credited for round `k.round` (the microbatches completed since the round before opened). */
  creditedSteps(k: RoundKey, minerId: string): number {
    const previous = k.round > 1 ? (this.state.mergeRounds.get({ ...k, round: k.round - 1 })?.startedAt ?? 0) : 0;
    const opened = this.state.mergeRounds.get(k)?.startedAt ?? Number.MAX_SAFE_INTEGER;
    return this.state.ledger.unitsBetween({ minerId, runId: k.runId, stage: k.stage, kind: 'backward', after: previous, until: opened });
  }

  /**
   * A replica's pseudo-gradient slice of one partition: decoded (shape,
   * codec, sha256, finite), every value within AdamW's reach from the round's
   * starting state. Returns its norm and the steps it counts for.
   */
  async checkUpload(run: RunRecord, s: StageRecord, k: RoundKey, p: Partition, minerId: string, claimedSteps: number, bytes: Uint8Array): Promise<{ norm: number; samples: number }> {
    const slice = readPartitionInt8(bytes, p);
    const credited = this.creditedSteps(k, minerId);
    const steps = Math.min(claimedSteps, 2 * credited + UNCREDITED_STEPS_SLACK);
    const start = await this.stageStates.at(run, k.stage, k.round - 1);
    if (!start) throw new NimbleError('conflict', `the state round ${k.round} started from is not kept`);
    const lr = run.options.lr;
    const reach = sliceReach(slice, p, start, steps + FEEDBACK_STEPS, lr);
    if ('outside' in reach) {
      const { at, value, bound } = reach.outside;
      const message = `pseudo-gradient value ${value} at parameter ${at} is more than ${steps} AdamW steps at lr ${lr} (and the error feedback of ${FEEDBACK_STEPS} more) can move it (${bound.toExponential(3)})`;
      throw new OffenceError(message, { runId: run.id, stage: k.stage, key: `pseudo-gradient ${k.runId}/${k.stage}/${k.round}/${p.index}` });
    }
    return { norm: reach.norm, samples: Math.min(claimedSteps, credited) };
  }

  /** Merges partition `p` of the round here, as its mergers should have; stores the frame and returns its blob id. */
  async recompute(run: RunRecord, s: StageRecord, round: MergeRoundRecord, p: number): Promise<string> {
    const rule = round.plan.rule;
    if (!rule) throw new NimbleError('conflict', `round ${round.round} has no merge rule yet`);
    const part = this.partitions(run, s, round.partitions)[p];
    const k: RoundKey = { runId: run.id, stage: s.stage, round: round.round };
    const inputs = [];
    for (const u of this.state.mergeRounds.uploads(k)) {
      if (u.partition !== p || !round.replicas.includes(u.minerId)) continue;
      inputs.push({ minerId: u.minerId, samples: u.samples, slice: decodePartitionFrame(await this.blobs.get(u.blob), part) });
    }
    const merged = mergeSlices(inputs, { aggregator: rule.aggregator, trim: rule.trim, maxNorm: rule.maxNorms[p] ?? null });
    return this.blobs.put(encodeMergedPartition(merged, part, { runId: run.id, stage: s.stage, round: round.round }));
  }

  /**
   * The state a merged round (partitions > 0) ends with: the outer step of
   * its chosen partitions from the state it started at, as every replica
   * computes it when it applies the round (StageRunner.applyOuterStep).
   */
  async mergedState(run: RunRecord, s: StageRecord, round: MergeRoundRecord): Promise<StageState> {
    if (round.partitions === 0 || !round.plan.chosen) throw new NimbleError('conflict', `round ${round.round} of stage ${s.stage} has no merged partitions`);
    const start = await this.stageStates.at(run, s.stage, round.round - 1);
    if (!start) throw new NimbleError('conflict', `the state round ${round.round} started from is not kept`);
    const parts = this.partitions(run, s, round.partitions);
    const frames: Uint8Array[] = [];
    for (const blob of round.plan.chosen) frames.push(await this.blobs.get(blob));
    const delta = decodePartitionFrames(frames, parts, undefined, { codecs: ['int8-block', 'f16', 'f32'] });
    const outer = { ...createOuterState(delta.length, { lr: run.options.outerLr, momentum: run.options.outerMomentum }), step: start.outerStep, momentumBuffer: start.momentum.slice() };
    const weights = outerStep(outer, start.weights, delta);
    return { weights, momentum: outer.momentumBuffer, outerStep: outer.step, decaySize: start.decaySize };
  }

  /** Writes the state a merged round ends with (`mergedState`) as a stage checkpoint; returns its blob id. */
  async writeMergedState(run: RunRecord, s: StageRecord, round: MergeRoundRecord): Promise<string> {
    const state = await this.mergedState(run, s, round);
    return this.blobs.put(this.stageStates.encode(run, s.stage, round.round, state));
  }

  /**
   * Throws unless `bytes` is a state the single replica of a round without a
   * merge could have saved: its trained weights within AdamW's reach of the
   * round's start, the outer momentum and step unchanged ('invalid' when it
   * does not decode, an offence when it decodes but is not).
   */
  async checkState(run: RunRecord, s: StageRecord, round: MergeRoundRecord, bytes: Uint8Array): Promise<void> {
    const stateOffence = (message: string): OffenceError => new OffenceError(message, { runId: run.id, stage: s.stage, key: `stage state ${run.id}/${s.stage}/${round.round}` });
    const start = await this.stageStates.at(run, s.stage, round.round - 1);
    if (!start) throw new NimbleError('conflict', `the state round ${round.round} started from is not kept`);
    let uploaded;
    try {
      uploaded = await this.stageStates.decode(run, s.stage, bytes);
    } catch (err) {
      throw new NimbleError('invalid', `stage state: ${(err as Error).message}`);
    }
    const steps = round.replicas.reduce((n, m) => Math.max(n, this.creditedSteps({ runId: run.id, stage: s.stage, round: round.round }, m)), 0) * 2 + UNCREDITED_STEPS_SLACK;
    const at = firstOutOfReach(uploaded.weights, start.weights, start.decaySize, steps, run.options.lr);
    if (at >= 0) throw stateOffence(`stage state: weight ${at} is further from the round's start than ${steps} AdamW steps reach`);
    if (!sameBits(uploaded.momentum, start.momentum) || uploaded.outerStep !== start.outerStep) throw stateOffence('stage state: the outer momentum changed without a merge');
  }
}

/**
 * A replica's quantized pseudo-gradient slice of partition `p` (codes × block
 * scales, readPartitionInt8) against what `steps` AdamW steps at `lr` can
 * move each weight from the round's starting `weights` (floats
 * [0, decaySize) take weight decay): the first value beyond that reach (its
 * parameter, value and bound), or else the slice's norm. This round's int8
 * quantization adds at most half a step of its block's scale: 1% covers it.
 *
 * Read from the codes, once: a weight's bound is affine in it
 * (adamMoveBound: a + c·|w0|, c = 0 without decay), so a block whose largest
 * possible value, 128 × its scale, is within the smallest bound (`a` without
 * decay) passes whole; only a block with a value that might be out of reach
 * has its values held against their weights' bounds. Honest AdamW moves
 * stay well inside the worst case the bound allows, so nearly every block
 * passes whole, and the check costs about a pass over the codes for the norm.
 */
export function sliceReach(q: Int8Payload, p: Partition, start: { weights: Float32Array; decaySize: number }, steps: number, lr: number): { norm: number } | { outside: { at: number; value: number; bound: number } } {
  const { scales, codes, groupSize } = q;
  const plain = adamMoveBoundTerms(steps, lr, 0).base * 1.01 + 1e-6;
  const terms = adamMoveBoundTerms(steps, lr, ADAMW_DEFAULTS.weightDecay);
  const decayed = terms.base * 1.01 + 1e-6;
  const perWeight = terms.perWeight * 1.01;
  let norm2 = 0;
  for (let g = 0; g < scales.length; g++) {
    const from = g * groupSize;
    const to = Math.min(from + groupSize, codes.length);
    const scale = scales[g];
    let squares = 0;
    for (let i = from; i < to; i++) squares += codes[i] * codes[i];
    norm2 += squares * scale * scale;
    if (128 * scale <= plain) continue;
    for (let i = from; i < to; i++) {
      const at = p.start + i;
      const value = Math.fround(codes[i] * scale);
      const bound = at < start.decaySize ? decayed + perWeight * Math.abs(start.weights[at]) : plain;
      if (!(Math.abs(value) <= bound)) return { outside: { at, value, bound } };
    }
  }
  return { norm: Math.sqrt(norm2) };
}

function sameBits(a: Float32Array, b: Float32Array): boolean {
  if (a.length !== b.length) return false;
  const x = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const y = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return false;
  return true;
}
