// Placement: cut the GPT into stages and choose which miners hold each one.
//
// - cutStages: contiguous ranges of parts minimizing the largest stage's
//   forward + backward FLOPs per token (compute, not parameters), optionally
//   under a memory cap per stage.
// - chooseStageCount: how many stages, when the caller does not say.
// - planPlacement: cuts plus miners, so that every stage fits its miners'
//   memory and the slowest stage is as fast as possible (src/planner/assign.ts).
// - rebalance (src/planner/rebalance.ts): miners joined or left; keep the cuts,
//   move as few miners as possible.
import type { GptConfig } from '../model/config.ts';
import { validateGptShape } from '../model/config.ts';
import { partCount, partName, type StageRange } from '../model/parts.ts';
import { assignMiners, diagnoseAssignment, stageThroughput, validateMiners, type AssignResult, type StageDemand } from './assign.ts';
import { partFlopsPerToken, stageCostTable, totalFlops, type MemoryModel, type StageCost } from './cost.ts';
import { PlanError, formatBytes } from './errors.ts';
import type { MinerCapacity, Plan } from './types.ts';

/** Default node budget of the exact assignment search (a few ms). */
export const DEFAULT_EXACT_SEARCH_LIMIT = 100_000;
/** Default: a plan with more stages must beat the best plan with fewer by this fraction. */
export const DEFAULT_STAGE_GAIN = 0.1;

export interface CutOptions {
  /** if set, no stage may need more bytes than this (needs batchSize and slots) */
  maxStageMemoryBytes?: number;
  /** sequences per microbatch, for the memory cap */
  batchSize?: number;
  /** microbatches in flight per stage, for the memory cap */
  slots?: number;
  /** bytes per parameter and activation (default: the engine's, ENGINE_MEMORY) */
  memory?: MemoryModel;
}

export interface StageCountOptions {
  /** sequences per microbatch */
  batchSize: number;
  /** microbatches in flight per stage */
  slots: number;
  /** a plan with more stages must beat the best plan with fewer by this fraction (default 0.1) */
  stageGain?: number;
  /** bytes per parameter and activation (default: the engine's, ENGINE_MEMORY) */
  memory?: MemoryModel;
}

export interface PlanInput {
  config: GptConfig;
  miners: MinerCapacity[];
  /** number of stages; chosen by chooseStageCount when omitted */
  stages?: number;
  /** sequences per microbatch */
  batchSize: number;
  /** microbatches in flight per stage */
  slots: number;
  /**
   * replicas every stage must get. Default: 2 when there are at least 2 miners
   * per stage and memory allows it, else 1. When given, a hard requirement.
   */
  minReplicas?: number;
  /** node budget of the exact assignment search; 0 = greedy + local search only */
  exactSearchLimit?: number;
  /** see StageCountOptions.stageGain */
  stageGain?: number;
  /** bytes per parameter and activation (default: the engine's, ENGINE_MEMORY) */
  memory?: MemoryModel;
}

/** How a stage is named in messages: "stage 2 [3,5)". */
export function stageLabel(index: number, range: StageRange): string {
  return `stage ${index} [${range.from},${range.to})`;
}

/**
 * Cuts the model's parts into `stages` contiguous ranges covering them all,
 * minimizing the largest stage's forward + backward FLOPs per token; among
 * cuts with that maximum, the one with the smallest sum of squared stage
 * FLOPs (the most even). Dynamic programming over cut points, O(S·P²).
 * With `maxStageMemoryBytes`, only ranges that fit the cap are allowed;
 * throws PlanError when no such cut exists.
 */
export function cutStages(config: GptConfig, stages: number, opts: CutOptions = {}): StageRange[] {
  validateGptShape(config);
  const P = partCount(config);
  if (!Number.isInteger(stages) || stages < 1 || stages > P) {
    throw new RangeError(`cannot cut ${P} parts into ${stages} stages: stages must be in [1, ${P}]`);
  }
  const flops = Array.from({ length: P }, (_, p) => totalFlops(partFlopsPerToken(config, p)));
  const prefix = [0];
  for (const f of flops) prefix.push(prefix[prefix.length - 1] + f);
  const cost = (i: number, j: number): number => prefix[j] - prefix[i];
  const allowed = memoryFilter(config, opts);

  // pass 1: the smallest possible maximum
  const inf = Infinity;
  let prev = new Array<number>(P + 1).fill(inf);
  prev[0] = 0;
  for (let k = 1; k <= stages; k++) {
    const cur = new Array<number>(P + 1).fill(inf);
    for (let j = k; j <= P - (stages - k); j++) {
      for (let i = k - 1; i < j; i++) {
        if (prev[i] === inf || !allowed(i, j)) continue;
        const v = Math.max(prev[i], cost(i, j));
        if (v < cur[j]) cur[j] = v;
      }
    }
    prev = cur;
  }
  const best = prev[P];
  if (best === inf) throw new PlanError(cutRefusal(config, stages, opts));

  // pass 2: under that maximum, the most even cut
  const limit = best * (1 + 1e-12);
  const sq: number[][] = [new Array<number>(P + 1).fill(inf)];
  const from: number[][] = [new Array<number>(P + 1).fill(-1)];
  sq[0][0] = 0;
  for (let k = 1; k <= stages; k++) {
    sq.push(new Array<number>(P + 1).fill(inf));
    from.push(new Array<number>(P + 1).fill(-1));
    for (let j = k; j <= P - (stages - k); j++) {
      for (let i = k - 1; i < j; i++) {
        const c = cost(i, j);
        if (sq[k - 1][i] === inf || c > limit || !allowed(i, j)) continue;
        const v = sq[k - 1][i] + c * c;
        if (v < sq[k][j]) {
          sq[k][j] = v;
          from[k][j] = i;
        }
      }
    }
  }
  const ranges: StageRange[] = [];
  for (let k = stages, j = P; k > 0; k--) {
    const i = from[k][j];
    ranges.unshift({ from: i, to: j });
    j = i;
  }
  return ranges;
}

/**
 * Picks the number of stages S for these miners.
 *
 * The rule: S ranges over 1 … min(parts, miners). For each S the model is
 * cut by compute (cutStages) and, if that cut does not fit, cut again under a
 * memory cap equal to the memory of the (S·r)-th largest miner, r being the
 * replicas per stage wanted. A stage count is a candidate when every stage
 * fits on miners that hold it and gets r replicas, with r = 2 when there are
 * at least 2·S miners (so replicas can merge) and r = 1 otherwise. If some
 * candidate has 2 replicas per stage, only those count. Among the candidates
 * the planned bottleneck throughput decides, and the fewest stages win unless
 * more stages raise it by more than `stageGain` (10%): every stage boundary
 * is a network hop per token, and a pipeline only helps when it lets more
 * miners work (a miner too small for a big stage fits a smaller one).
 * Throws PlanError when no S fits, with the numbers of the finest cut.
 */
export function chooseStageCount(config: GptConfig, miners: MinerCapacity[], opts: StageCountOptions): number {
  return chooseLayout(config, miners, opts, undefined).ranges.length;
}

/**
 * Plans a job: cuts the model (`stages` given or chosen by
 * chooseStageCount), then assigns miners so that every stage gets its
 * minimum replicas on miners with enough memory and the slowest stage is as
 * fast as possible; miners that fit no stage are left unassigned. Throws
 * PlanError with the numbers when no valid plan exists.
 */
export function planPlacement(input: PlanInput): Plan {
  const { config, miners, batchSize, slots, memory } = input;
  validateGptShape(config);
  validateMiners(miners);
  const exactSearchLimit = input.exactSearchLimit ?? DEFAULT_EXACT_SEARCH_LIMIT;
  if (input.minReplicas !== undefined && !(Number.isInteger(input.minReplicas) && input.minReplicas >= 1)) {
    throw new RangeError(`minReplicas must be a positive integer, got ${input.minReplicas}`);
  }
  let layout: Layout;
  if (input.stages === undefined) {
    layout = chooseLayout(config, miners, { batchSize, slots, stageGain: input.stageGain, memory }, input.minReplicas);
  } else {
    const S = input.stages;
    const P = partCount(config);
    if (!Number.isInteger(S) || S < 1 || S > P) throw new RangeError(`stages must be an integer in [1, ${P}], got ${S}`);
    const wanted = input.minReplicas !== undefined ? [input.minReplicas] : miners.length >= 2 * S ? [2, 1] : [1];
    let last: string | null = null;
    let found: Layout | null = null;
    for (const r of wanted) {
      const attempt = layoutFor(config, miners, S, r, batchSize, slots, memory);
      if ('reason' in attempt) last = attempt.reason;
      else {
        found = attempt;
        break;
      }
    }
    if (!found) throw new PlanError(last!);
    layout = found;
  }
  const result = assignMiners(layout.demands, miners, { minReplicas: layout.minReplicas, exactSearchLimit });
  return buildPlan(layout, miners, result);
}

/**
 * Plans a model that is never cut (the MLP classifier: src/jobs/mlp-cost.ts
 * gives its cost, flopsPerToken per example): one stage holding it whole,
 * with every miner that holds it as a replica. Throws PlanError with the
 * numbers when no miner can.
 */
export function planSingleStage(input: { cost: StageCost; miners: MinerCapacity[]; label: string }): Plan {
  const { cost, miners } = input;
  validateMiners(miners);
  if (miners.length === 0) throw new PlanError('no miners available');
  const range = { from: 0, to: 1 };
  const demands = [{ flopsPerToken: totalFlops(cost.flopsPerToken), memoryBytes: cost.memoryBytes.total, label: input.label }];
  const layout: Layout = { ranges: [range], costs: [cost], demands, minReplicas: 1 };
  return buildPlan(layout, miners, assignMiners(demands, miners, { minReplicas: 1, exactSearchLimit: 0 }));
}

interface Layout {
  ranges: StageRange[];
  costs: StageCost[];
  demands: StageDemand[];
  minReplicas: number;
}

/** The cut for S stages with r replicas each, or why none fits. */
function layoutFor(config: GptConfig, miners: MinerCapacity[], S: number, r: number, batchSize: number, slots: number, memory?: MemoryModel): Layout | { reason: string } {
  const cost = stageCostTable(config, batchSize, slots, memory);
  const make = (ranges: StageRange[]): Layout => {
    const costs = ranges.map(cost);
    const demands = costs.map((c, s) => ({ flopsPerToken: totalFlops(c.flopsPerToken), memoryBytes: c.memoryBytes.total, label: stageLabel(s, ranges[s]) }));
    return { ranges, costs, demands, minReplicas: r };
  };
  const balanced = make(cutStages(config, S));
  const reason = diagnoseAssignment(balanced.demands, miners, r);
  if (reason === null) return balanced;
  if (miners.length >= S * r) {
    const cap = miners.map((m) => m.memoryBytes).sort((a, b) => b - a)[S * r - 1];
    try {
      const capped = make(cutStages(config, S, { maxStageMemoryBytes: cap, batchSize, slots, memory }));
      if (diagnoseAssignment(capped.demands, miners, r) === null) return capped;
    } catch (e) {
      if (!(e instanceof PlanError)) throw e;
    }
  }
  return { reason };
}

/** The stage count and cut chosen by the rule of chooseStageCount. */
function chooseLayout(config: GptConfig, miners: MinerCapacity[], opts: StageCountOptions, minReplicas: number | undefined): Layout {
  validateGptShape(config);
  validateMiners(miners);
  const gain = opts.stageGain ?? DEFAULT_STAGE_GAIN;
  if (!(gain >= 0)) throw new RangeError(`stageGain must be ≥ 0, got ${gain}`);
  const P = partCount(config);
  const maxS = Math.min(P, miners.length);
  if (maxS === 0) throw new PlanError('no miners available');
  const work = Array.from({ length: P }, (_, p) => totalFlops(partFlopsPerToken(config, p))).reduce((a, b) => a + b, 0);
  const ceiling = stageThroughput(miners.reduce((a, m) => a + m.gflops, 0), work);
  const candidates: { layout: Layout; bottleneck: number }[] = [];
  let finest: string | null = null;
  for (let S = 1; S <= maxS; S++) {
    const wanted = minReplicas !== undefined ? [minReplicas] : miners.length >= 2 * S ? [2, 1] : [1];
    for (const r of wanted) {
      const attempt = layoutFor(config, miners, S, r, opts.batchSize, opts.slots, opts.memory);
      if ('reason' in attempt) {
        if (S === maxS) finest = attempt.reason;
        continue;
      }
      const result = assignMiners(attempt.demands, miners, { minReplicas: r, exactSearchLimit: 0 });
      candidates.push({ layout: attempt, bottleneck: result.bottleneck });
      break;
    }
    // no plan beats every miner working on perfectly balanced stages: once the
    // pick is within stageGain of that, more stages cannot change it (unless
    // they could bring the first candidates with 2 replicas)
    const chosen = pick(candidates, gain);
    const settled = chosen !== null && (chosen.layout.minReplicas >= 2 || minReplicas !== undefined || miners.length < 2 * (S + 1));
    if (settled && chosen.bottleneck * (1 + gain) >= ceiling) break;
  }
  const chosen = pick(candidates, gain);
  if (!chosen) throw new PlanError(noLayoutReason(config, miners, opts, maxS, finest));
  return chosen.layout;
}

/** The rule's choice among candidates (ascending S): 2 replicas if any have it, then the fewest stages within `gain` of the best bottleneck. */
function pick<T extends { layout: Layout; bottleneck: number }>(candidates: T[], gain: number): T | null {
  if (candidates.length === 0) return null;
  const replicated = candidates.filter((c) => c.layout.minReplicas >= 2);
  const pool = replicated.length > 0 ? replicated : candidates;
  const best = Math.max(...pool.map((c) => c.bottleneck));
  return pool.find((c) => c.bottleneck * (1 + gain) >= best)!;
}

/** Why no stage count works: a part bigger than every miner, else the finest cut's numbers. */
function noLayoutReason(config: GptConfig, miners: MinerCapacity[], opts: StageCountOptions, maxS: number, finest: string | null): string {
  const largest = Math.max(...miners.map((m) => m.memoryBytes));
  const cost = stageCostTable(config, opts.batchSize, opts.slots, opts.memory);
  for (let p = 0; p < partCount(config); p++) {
    const need = cost({ from: p, to: p + 1 }).memoryBytes.total;
    if (need > largest) {
      return `part ${p} (${partName(config, p)}) alone needs ${formatBytes(need)}; the largest miner has ${formatBytes(largest)}`;
    }
  }
  return `no cut fits these ${miners.length} miners; cut into ${maxS} stage${maxS === 1 ? '' : 's'}: ${finest ?? 'no valid cut'}`;
}

/** Which ranges [i, j) fit the memory cap. */
function memoryFilter(config: GptConfig, opts: CutOptions): (i: number, j: number) => boolean {
  const cap = opts.maxStageMemoryBytes;
  if (cap === undefined) return () => true;
  const { batchSize, slots } = opts;
  if (batchSize === undefined || slots === undefined) throw new RangeError('maxStageMemoryBytes needs batchSize and slots');
  const cost = stageCostTable(config, batchSize, slots, opts.memory);
  return (i, j) => cost({ from: i, to: j }).memoryBytes.total <= cap;
}

/** Why no cut into `stages` ranges fits the memory cap. */
function cutRefusal(config: GptConfig, stages: number, opts: CutOptions): string {
  const cap = opts.maxStageMemoryBytes!;
  const P = partCount(config);
  const cost = stageCostTable(config, opts.batchSize!, opts.slots!, opts.memory);
  const need = (i: number, j: number): number => cost({ from: i, to: j }).memoryBytes.total;
  for (let p = 0; p < P; p++) {
    const n = need(p, p + 1);
    if (n > cap) return `part ${p} (${partName(config, p)}) alone needs ${formatBytes(n)}; the cap is ${formatBytes(cap)}`;
  }
  // memory grows with the range, so the longest prefix that fits gives the fewest stages
  let count = 0;
  for (let i = 0; i < P; count++) {
    let j = i + 1;
    while (j < P && need(i, j + 1) <= cap) j++;
    i = j;
  }
  return `cannot cut ${P} parts into ${stages} stages of at most ${formatBytes(cap)} each; that needs at least ${count} stages`;
}

function buildPlan(layout: Layout, miners: MinerCapacity[], result: AssignResult): Plan {
  const stages = layout.ranges.map((range, s) => {
    const ids = miners.filter((_, i) => result.stageOf[i] === s);
    const gflops = ids.reduce((a, m) => a + m.gflops, 0);
    return {
      range: { ...range },
      params: layout.costs[s].params,
      flopsPerToken: { ...layout.costs[s].flopsPerToken },
      memoryBytes: layout.costs[s].memoryBytes.total,
      miners: ids.map((m) => m.id),
      throughputTokensPerS: stageThroughput(gflops, layout.demands[s].flopsPerToken),
    };
  });
  return {
    stages,
    bottleneckTokensPerS: Math.min(...stages.map((s) => s.throughputTokensPerS)),
    unassigned: miners.filter((_, i) => result.stageOf[i] < 0).map((m) => m.id),
  };
}
