// Layouts of S pipeline stages × R replicas over live miners: the stages of
// a cut and what a replica of each needs per item, which miners hold them,
// and how fast they train.
//
// Throughput (the planner's model, docs/planner.md, plus the network): a
// replica of stage s trains min(compute, upload) items per second, where
// compute = GFLOP/s · 1e9 / (FLOPs per item of s) and upload = its measured
// upload bandwidth / bytes it uploads per item: the activations it sends
// downstream and the activation gradients it sends upstream (C values per
// token each way, f16 by default: ACTIVATION_BYTES) and its share of the
// merges (src/merge/traffic.ts: the upload of one round, with frames of
// MERGE_FRAME_BYTES_PER_PARAM, spread over the mergeEvery × items per step
// it trains between merges). With several microbatches in flight a replica
// computes one while it sends another, so the slower of the two sets its
// pace. A stage trains the sum of its replicas; the pipeline, its slowest
// stage. Wall time = steps × items per step / that.
import { mergeTrafficPerReplica } from '../merge/traffic.ts';
import type { StageRange } from '../model/parts.ts';
import { assignMiners, diagnoseAssignment, type StageDemand } from '../planner/assign.ts';
import { totalFlops, type StageCost } from '../planner/cost.ts';
import { PlanError } from '../planner/errors.ts';
import { stageLabel } from '../planner/placement.ts';
import { ACTIVATION_BYTES, MERGE_FRAME_BYTES_PER_PARAM, costNim } from './plan-constants.ts';
import type { JobLayout, PoolMiner } from './plan-schema.ts';
import type { Context } from './plan-workload.ts';
import { itemsPerStep } from './spec.ts';

/** A stage of a layout with what a replica of it needs per item. */
interface StageSpec {
  range: StageRange | null;
  cost: StageCost;
  flops: number;
  /** bytes a replica uploads per item: activations, their gradients, its share of the merges */
  uploadBytes: number;
  label: string;
}

/** Miners that can work (a positive, finite GFLOP/s), each id once. */
export function usableMiners(miners: readonly PoolMiner[]): PoolMiner[] {
  const seen = new Set<string>();
  const out: PoolMiner[] = [];
  for (const m of miners) {
    if (typeof m.id !== 'string' || m.id.length === 0 || seen.has(m.id)) continue;
    if (!(Number.isFinite(m.gflops) && m.gflops > 0 && Number.isFinite(m.memoryBytes) && m.memoryBytes >= 0)) continue;
    seen.add(m.id);
    out.push({ ...m, bandwidthMbps: Number.isFinite(m.bandwidthMbps) && m.bandwidthMbps > 0 ? m.bandwidthMbps : 0 });
  }
  return out;
}

/** The stages of a cut, with what a replica of each needs per item when there are R replicas. */
function stageSpecs(ctx: Context, ranges: (StageRange | null)[], R: number): StageSpec[] {
  const S = ranges.length;
  const itemsPerMerge = ctx.job.mergeEvery * itemsPerStep(ctx.job.model, ctx.job.batchSize);
  return ranges.map((range, s) => {
    const cost = ctx.work.cost(range);
    const frames = cost.params * MERGE_FRAME_BYTES_PER_PARAM;
    const merge = mergeTrafficPerReplica({ replicas: R, pseudoGradientBytes: frames, mergedBytes: frames }).upload / itemsPerMerge;
    const activations = ((s < S - 1 ? 1 : 0) + (s > 0 ? 1 : 0)) * ctx.work.boundaryValues * ACTIVATION_BYTES;
    return { range, cost, flops: totalFlops(cost.flopsPerToken), uploadBytes: activations + merge, label: range ? stageLabel(s, range) : 'the model' };
  });
}

function demands(specs: StageSpec[]): StageDemand[] {
  return specs.map((s) => ({ flopsPerToken: s.flops, memoryBytes: s.cost.memoryBytes.total, label: s.label }));
}

/** Items per second a miner trains on a stage: its compute and its upload, the slower of the two. */
function minerRate(m: PoolMiner, s: StageSpec): { compute: number; network: number; rate: number } {
  const compute = (m.gflops * 1e9) / s.flops;
  const network = s.uploadBytes > 0 ? (m.bandwidthMbps * 1e6) / 8 / s.uploadBytes : Infinity;
  return { compute, network, rate: Math.min(compute, network) };
}

/**
 * S × R on `pool`: the planner's cut (re-cut under the memory of the S·R-th
 * largest miner if needed, as planPlacement does), then the miners
 * (pickMiners), spread over the stages (spreadMiners). With `balance`, the
 * planner's assignment of those miners (src/planner/assign.ts) is tried too
 * and kept if faster: it is the costly part, so only the chosen layout gets it.
 */
export function evaluateLayout(ctx: Context, S: number, R: number, pool: readonly PoolMiner[], balance: boolean, memories = memoriesDescending(pool)): JobLayout {
  const layout = (specs: StageSpec[]): JobLayout => ({
    stages: S,
    replicas: R,
    miners: S * R,
    fitsMemory: false,
    reason: null,
    largestStageBytes: Math.max(...specs.map((s) => s.cost.memoryBytes.total)),
    itemsPerS: 0,
    wallTimeMs: null,
    costNim: costNim(ctx.trainingFlops + (R >= 2 ? ctx.mergeFlops : 0), ctx.pricing),
    meetsDeadline: false,
    limitedBy: null,
    assignment: [],
  });
  let specs = stageSpecs(ctx, ctx.work.cut(S), R);
  if (!coverable(specs, R, memories)) {
    let recut: StageSpec[] | null = null;
    if (S > 1 && pool.length >= S * R) {
      try {
        const attempt = stageSpecs(ctx, ctx.work.cut(S, memories[S * R - 1]), R);
        if (coverable(attempt, R, memories)) recut = attempt;
      } catch (e) {
        if (!(e instanceof PlanError)) throw e;
      }
    }
    if (!recut) return { ...layout(specs), reason: diagnoseAssignment(demands(specs), pool, R) };
    specs = recut;
  }
  let groups = pickMiners(specs, R, pool);
  let speed = groupSpeed(specs, groups);
  if (S > 1) {
    const spread = spreadMiners(specs, groups.flat(), R);
    const s = groupSpeed(specs, spread);
    if (s.bottleneck > speed.bottleneck) [groups, speed] = [spread, s];
  }
  // the planner's assignment only when the pick is more than 5% below perfectly balanced compute
  const ideal = (groups.flat().reduce((a, m) => a + m.gflops, 0) * 1e9) / specs.reduce((a, s) => a + s.flops, 0);
  if (balance && S > 1 && speed.bottleneck < 0.95 * ideal) {
    const balanced = rebalanceGroups(specs, groups, R);
    if (balanced) {
      const s = groupSpeed(specs, balanced);
      if (s.bottleneck > speed.bottleneck) [groups, speed] = [balanced, s];
    }
  }
  const wallTimeMs = speed.bottleneck > 0 ? (ctx.totalItems / speed.bottleneck) * 1000 : null;
  const slowest = speed.stages.reduce((a, s, i) => (s.rate < speed.stages[a].rate ? i : a), 0);
  return {
    ...layout(specs),
    fitsMemory: true,
    itemsPerS: speed.bottleneck,
    wallTimeMs,
    meetsDeadline: wallTimeMs !== null && wallTimeMs <= ctx.job.deadlineMs,
    limitedBy: speed.stages[slowest].limitedBy,
    assignment: specs.map((spec, s) => ({
      range: spec.range && { ...spec.range },
      memoryBytes: spec.cost.memoryBytes.total,
      miners: groups[s].map((m) => m.id),
      itemsPerS: speed.stages[s].rate,
      limitedBy: speed.stages[s].limitedBy,
    })),
  };
}

/**
 * R miners per stage: the stages needing the most memory first, each taking
 * the fastest (for it) unused miners that fit it. Memory eligibility is
 * nested, so this succeeds whenever diagnoseAssignment found no gap.
 */
function pickMiners(specs: StageSpec[], R: number, pool: readonly PoolMiner[]): PoolMiner[][] {
  const order = specs.map((_, s) => s).sort((a, b) => specs[b].cost.memoryBytes.total - specs[a].cost.memoryBytes.total || specs[b].flops - specs[a].flops);
  const used = new Set<PoolMiner>();
  const groups: PoolMiner[][] = specs.map(() => []);
  for (const s of order) {
    const spec = specs[s];
    const need = spec.cost.memoryBytes.total;
    // the R fastest, kept sorted (fastest first) as the pool is scanned
    const top: PoolMiner[] = [];
    const rates: number[] = [];
    for (const m of pool) {
      if (m.memoryBytes < need || used.has(m)) continue;
      const rate = minerRate(m, spec).rate;
      if (top.length === R && rate <= rates[R - 1]) continue;
      let i = top.length === R ? R - 1 : top.length;
      while (i > 0 && rates[i - 1] < rate) {
        top[i] = top[i - 1];
        rates[i] = rates[i - 1];
        i--;
      }
      top[i] = m;
      rates[i] = rate;
    }
    groups[s] = top;
    for (const m of top) used.add(m);
  }
  return groups;
}

/**
 * The same miners spread over the stages so the slowest stage is as fast as
 * a greedy makes it (the planner's first step): fastest first, each to the
 * slowest stage it fits that still lacks replicas, unless that would leave a
 * stage unable to get its R replicas from the miners left.
 */
function spreadMiners(specs: StageSpec[], miners: PoolMiner[], R: number): PoolMiner[][] {
  const S = specs.length;
  const need = specs.map((s) => s.cost.memoryBytes.total);
  const groups: PoolMiner[][] = specs.map(() => []);
  const rate = new Array<number>(S).fill(0);
  const left = [...miners].sort((a, b) => b.gflops - a.gflops || b.bandwidthMbps - a.bandwidthMbps);
  const byNeed = specs.map((_, s) => s).sort((a, b) => need[b] - need[a]);
  // can the miners left (from index `from`) fill every stage's open slots? Hall's condition on nested memory
  const feasible = (from: number): boolean => {
    const mems = left.slice(from).map((m) => m.memoryBytes).sort((a, b) => b - a);
    let want = 0;
    let have = 0;
    for (const s of byNeed) {
      want += R - groups[s].length;
      while (have < mems.length && mems[have] >= need[s]) have++;
      if (have < want) return false;
    }
    return true;
  };
  for (let i = 0; i < left.length; i++) {
    const m = left[i];
    const open = specs.map((_, s) => s).filter((s) => groups[s].length < R && m.memoryBytes >= need[s]).sort((a, b) => rate[a] - rate[b] || need[b] - need[a]);
    for (const s of open) {
      groups[s].push(m);
      if (feasible(i + 1)) {
        rate[s] += minerRate(m, specs[s]).rate;
        break;
      }
      groups[s].pop();
    }
  }
  return groups.every((g) => g.length === R) ? groups : pickMiners(specs, R, miners);
}

/** The pool's memories, largest first. */
export function memoriesDescending(pool: readonly PoolMiner[]): number[] {
  return pool.map((m) => m.memoryBytes).sort((a, b) => b - a);
}

/** Hall's condition for nested eligibility (as coverageGap in src/planner/assign.ts): can every stage get R replicas that fit it? */
function coverable(specs: StageSpec[], R: number, memoriesDesc: readonly number[]): boolean {
  const needs = specs.map((s) => s.cost.memoryBytes.total).sort((a, b) => b - a);
  for (let k = 0; k < needs.length; k++) {
    // miners with at least needs[k]: binary search in the descending list
    let lo = 0;
    let hi = memoriesDesc.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (memoriesDesc[mid] >= needs[k]) lo = mid + 1;
      else hi = mid;
    }
    if (lo < (k + 1) * R) return false;
  }
  return true;
}

/** The planner's assignment (src/planner/assign.ts) of the same miners, R per stage, balancing compute; null if it fails. */
function rebalanceGroups(specs: StageSpec[], groups: PoolMiner[][], R: number): PoolMiner[][] | null {
  const flat = groups.flat();
  try {
    const result = assignMiners(demands(specs), flat, { minReplicas: R, exactSearchLimit: 0 });
    const out = specs.map((_, s) => flat.filter((_, i) => result.stageOf[i] === s));
    return out.every((g) => g.length === R) ? out : null;
  } catch (e) {
    if (e instanceof PlanError) return null;
    throw e;
  }
}

function groupSpeed(specs: StageSpec[], groups: PoolMiner[][]): { bottleneck: number; stages: { rate: number; limitedBy: 'compute' | 'network' }[] } {
  const stages = specs.map((spec, s) => {
    let rate = 0;
    let compute = 0;
    let network = 0;
    for (const m of groups[s]) {
      const r = minerRate(m, spec);
      rate += r.rate;
      compute += r.compute;
      network += r.network;
    }
    return { rate, limitedBy: network < compute ? ('network' as const) : ('compute' as const) };
  });
  return { bottleneck: Math.min(...stages.map((s) => s.rate)), stages };
}
