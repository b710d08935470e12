// The "upgrade" analysis of one job (`nbcli job plan`): what the model needs
// (parameters, FLOPs per token or per example, memory per stage broken down),
// which layouts of S pipeline stages × R replicas the live miners allow, how
// fast each would train and what it would cost, which one to use and on
// which miners, and a few lines saying why. Pure: the caller brings the job
// and the miners' measured figures. A `JobPlan` is plain JSON data with a
// TypeBox schema, so it can travel over HTTP.
//
// Pricing. A job pays for the work it needs: cost in NIM = total training
// FLOPs × the price in NIM per petaflop (1e15 FLOPs). Total training FLOPs =
// steps × items per step × (forward + backward FLOPs per item), plus the
// merges when replicas merge (MERGE_FLOPS_PER_PARAM per parameter per round:
// 0.002% for gpt-tiny at the default mergeEvery). The work hardly depends on the layout, so
// neither does the cost: an upgrade buys time, not NIM. DEFAULT_PRICING is
// 1 NIM per PFLOP, so a miner sustaining 100 GFLOP/s (0.36 PFLOP an hour)
// earns about 0.36 NIM an hour, 8.6 NIM a day, while it trains.
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
//
// The choice. Candidates are S × R for S in stageCounts (every S up to the
// model's parts, or a spread of them for deep models; 1 for the MLP, which is
// never cut) and R in REPLICA_COUNTS, on the live miners. The chosen layout
// is the cheapest that fits memory and meets the deadline (costs within
// COST_TIE count as equal; then the fewest miners, then the fewest stages),
// moved onto the smallest miners that still meet the deadline (miners sorted
// by memory, then speed: the shortest prefix of that order that is enough).
// If none meets the deadline, the fastest layout that fits, flagged
// `meetsDeadline: false`. `default` is one miner, the smallest that holds the
// whole model: the job starts there, and "upgrade" moves it to `chosen`.
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { mergeTrafficPerReplica } from '../merge/traffic.ts';
import { partCount, partName, StageRange } from '../model/gpt.ts';
import { assignMiners, diagnoseAssignment, type StageDemand } from '../planner/assign.ts';
import { stageCostTable, totalFlops, type MemoryBytes, type StageCost } from '../planner/cost.ts';
import { PlanError, formatBytes } from '../planner/errors.ts';
import { cutStages, stageLabel } from '../planner/placement.ts';
import { FlopsPerToken } from '../planner/types.ts';
import { formatDuration } from './duration.ts';
import { mlpCost } from './mlp-cost.ts';
import { itemsPerStep, type JobModel, type ResolvedJob } from './spec.ts';

/** A live miner as the orchestrator measured it. */
export interface PoolMiner {
  id: string;
  name?: string;
  /** measured effective GFLOP/s */
  gflops: number;
  /** memory it can give a job, in bytes */
  memoryBytes: number;
  /** measured upload bandwidth, Mbit/s */
  bandwidthMbps: number;
}

const Nullable = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);
const Bytes = Type.Integer({ minimum: 0 });
const Count = Type.Integer({ minimum: 0 });
const Limit = Type.Union([Type.Literal('compute'), Type.Literal('network')]);

/** The network's price of work. */
export const JobPricing = Type.Object({
  /** NIM per petaflop (1e15 FLOPs) of training work */
  nimPerPetaflop: Type.Number({ exclusiveMinimum: 0 }),
});
export type JobPricing = Static<typeof JobPricing>;

/** 1 NIM per PFLOP: a miner sustaining 100 GFLOP/s earns about 0.36 NIM per hour of training. */
export const DEFAULT_PRICING: JobPricing = { nimPerPetaflop: 1 };

/** Microbatches in flight per miner, as the coordinator's default (COORDINATOR_DEFAULTS.slots): the planner sizes GPT activations with it. */
export const JOB_SLOTS = 3;
/** Bytes per activation value sent between stages: runs send activations and their gradients as f16 by default. */
export const ACTIVATION_BYTES = 2;
/** Bytes per parameter of pseudo-gradient and merged frames (int8-block: 1.017–1.022 measured, docs/merging.md). */
export const MERGE_FRAME_BYTES_PER_PARAM = 1.02;
/** FLOPs per parameter per replica per merge round: the pseudo-gradient 1, encoding 2, aggregation 1, the outer Nesterov step 6. */
export const MERGE_FLOPS_PER_PARAM = 10;
/** Replica counts tried per stage. */
export const REPLICA_COUNTS: readonly number[] = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32];
/** Stage counts tried for deep models (every S is tried up to this many parts). */
export const MAX_EVERY_STAGE_COUNT = 16;
/** Most stages tried. */
export const MAX_STAGES = 64;
/** Costs within this fraction of each other count as equal when choosing. */
export const COST_TIE = 0.01;

/** Bytes of one replica of a stage, broken down (as MemoryBytes of src/planner/cost.ts). */
export const MemoryBreakdown = Type.Object({
  weights: Bytes,
  gradients: Bytes,
  /** AdamW m and v, DiLoCo start weights and outer momentum */
  optimizer: Bytes,
  activations: Bytes,
  total: Bytes,
});
export type MemoryBreakdown = Static<typeof MemoryBreakdown>;

/** What one stage of a cut needs. */
export const StageNeed = Type.Object({
  /** parts [from, to) of the GPT; null for the MLP, which is never cut */
  range: Nullable(StageRange),
  params: Count,
  /** per token (GPT) or per example (MLP) */
  flopsPerItem: FlopsPerToken,
  memory: MemoryBreakdown,
});
export type StageNeed = Static<typeof StageNeed>;

/** The compute-balanced cut into `stages` stages (src/planner/placement.ts, cutStages). */
export const StageCut = Type.Object({
  stages: Type.Integer({ minimum: 1 }),
  needs: Type.Array(StageNeed, { minItems: 1 }),
  /** memory a miner needs to hold the cut's largest stage */
  largestStageBytes: Bytes,
});
export type StageCut = Static<typeof StageCut>;

/** One stage of a layout on live miners. */
export const LayoutStage = Type.Object({
  range: Nullable(StageRange),
  memoryBytes: Bytes,
  /** its replicas, by miner id */
  miners: Type.Array(Type.String()),
  /** items (tokens or examples) per second its replicas train together */
  itemsPerS: Type.Number({ minimum: 0 }),
  /** what limits it: the replicas' compute or their upload bandwidth */
  limitedBy: Limit,
});
export type LayoutStage = Static<typeof LayoutStage>;

/** S stages × R replicas on live miners: how fast, how long, how much. */
export const JobLayout = Type.Object({
  stages: Type.Integer({ minimum: 1 }),
  replicas: Type.Integer({ minimum: 1 }),
  /** miners it uses: stages × replicas */
  miners: Type.Integer({ minimum: 1 }),
  fitsMemory: Type.Boolean(),
  /** why it does not fit, with the numbers (null when it fits) */
  reason: Nullable(Type.String()),
  largestStageBytes: Bytes,
  /** tokens/s (GPT) or examples/s (MLP) of the slowest stage; 0 when it does not fit */
  itemsPerS: Type.Number({ minimum: 0 }),
  /** time to train every step; null when it does not fit */
  wallTimeMs: Nullable(Type.Number({ minimum: 0 })),
  costNim: Type.Number({ minimum: 0 }),
  meetsDeadline: Type.Boolean(),
  /** what limits the slowest stage (null when it does not fit) */
  limitedBy: Nullable(Limit),
  /** the stages and their miners, on `default` and `chosen` (empty on candidates, and when it does not fit) */
  assignment: Type.Array(LayoutStage),
  /** why these miners (on `default` and `chosen`) */
  why: Type.Optional(Type.String()),
});
export type JobLayout = Static<typeof JobLayout>;

/** The analysis of one job against the live miners. */
export const JobPlan = Type.Object({
  job: Type.String(),
  model: Type.Object({
    kind: Type.Union([Type.Literal('gpt'), Type.Literal('mlp')]),
    /** the GPT's name (gpt-tiny, …), null for an inline config or an MLP */
    name: Nullable(Type.String()),
    /** e.g. "gpt-tiny (V 256, T 64, C 128, 4 layers, 4 heads)", "MLP 4096→64→2" */
    summary: Type.String(),
  }),
  /** what the figures count: tokens for a GPT, examples for an MLP */
  unit: Type.Union([Type.Literal('token'), Type.Literal('example')]),
  params: Count,
  flopsPerItem: FlopsPerToken,
  batchSize: Type.Integer({ minimum: 1 }),
  itemsPerStep: Type.Integer({ minimum: 1 }),
  steps: Type.Integer({ minimum: 1 }),
  totalItems: Count,
  mergeEvery: Type.Integer({ minimum: 1 }),
  /** microbatches in flight per miner (GPT activations); null for the MLP */
  slots: Nullable(Type.Integer({ minimum: 1 })),
  /** steps × items per step × forward + backward FLOPs per item */
  trainingFlops: Type.Number({ minimum: 0 }),
  /** the merges' FLOPs when replicas merge (R ≥ 2) */
  mergeFlops: Type.Number({ minimum: 0 }),
  pricing: JobPricing,
  deadlineMs: Type.Number({ minimum: 0 }),
  /** the job's budget in NIM (null: none) */
  budgetNim: Nullable(Type.Number({ minimum: 0 })),
  /** the whole model on one miner */
  wholeModel: MemoryBreakdown,
  /** the smallest miner memory that holds the whole model */
  minMinerMemoryBytes: Bytes,
  /** the smallest miner memory that holds any stage at all: the largest single part (GPT), the whole (MLP) */
  minPieceMemoryBytes: Bytes,
  /** memory per stage for each stage count */
  cuts: Type.Array(StageCut),
  pool: Type.Object({
    /** live miners given, and those usable (a positive GFLOP/s, listed once) */
    miners: Count,
    usable: Count,
    /** miners that hold the whole model alone */
    holdWhole: Count,
    largestMemoryBytes: Bytes,
    gflops: Type.Number({ minimum: 0 }),
  }),
  candidates: Type.Array(JobLayout),
  /** one miner, the smallest that holds the whole model; null if none does */
  default: Nullable(JobLayout),
  /** the layout to upgrade to; null when nothing fits */
  chosen: Nullable(JobLayout),
  fits: Type.Boolean(),
  /** why nothing fits, with the numbers (null when a layout fits) */
  reason: Nullable(Type.String()),
  meetsDeadline: Type.Boolean(),
  /** chosen cost ≤ budget (null: no budget, or nothing fits) */
  withinBudget: Nullable(Type.Boolean()),
  explanation: Type.Array(Type.String()),
});
export type JobPlan = Static<typeof JobPlan>;

export interface PlanJobOptions {
  /** microbatches in flight per miner (default JOB_SLOTS) */
  slots?: number;
}

/** The model as the plan sees it: costs of its stages and how it can be cut. */
interface Workload {
  kind: 'gpt' | 'mlp';
  unit: 'token' | 'example';
  name: string | null;
  summary: string;
  whole: StageCost;
  /** values crossing a stage boundary per item, each way (C for a GPT) */
  boundaryValues: number;
  /** stage counts to try */
  stageCounts: number[];
  /** parts it is made of (1 for the MLP) */
  parts: number;
  cost(range: StageRange | null): StageCost;
  /** the compute-balanced cut into S stages, under a memory cap if given; throws PlanError if none */
  cut(stages: number, cap?: number): (StageRange | null)[];
  /** memory of each single part and its name */
  pieces(): { label: string; bytes: number }[];
}

/** What planning one job shares across its layouts. */
interface Context {
  job: ResolvedJob;
  work: Workload;
  pricing: JobPricing;
  totalItems: number;
  trainingFlops: number;
  mergeFlops: number;
}

/** A stage of a layout with what a replica of it needs per item. */
interface StageSpec {
  range: StageRange | null;
  cost: StageCost;
  flops: number;
  /** bytes a replica uploads per item: activations, their gradients, its share of the merges */
  uploadBytes: number;
  label: string;
}

/**
 * Plans `job` on `miners`: the model's needs, every S × R layout the miners
 * allow, the chosen one and the one-miner default. Never throws for a job
 * that does not fit: `fits` is false and `explanation` says why, with the
 * numbers.
 */
export function planJob(job: ResolvedJob, miners: readonly PoolMiner[], pricing: JobPricing = DEFAULT_PRICING, options: PlanJobOptions = {}): JobPlan {
  if (!(Number.isFinite(pricing.nimPerPetaflop) && pricing.nimPerPetaflop > 0)) throw new RangeError(`nimPerPetaflop must be a positive number, got ${pricing.nimPerPetaflop}`);
  const slots = options.slots ?? JOB_SLOTS;
  if (!Number.isInteger(slots) || slots < 1) throw new RangeError(`slots must be a positive integer, got ${slots}`);
  const work = workload(job.model, job.batchSize, slots);
  const perStep = itemsPerStep(job.model, job.batchSize);
  const totalItems = job.steps * perStep;
  const ctx: Context = {
    job,
    work,
    pricing,
    totalItems,
    trainingFlops: totalItems * totalFlops(work.whole.flopsPerToken),
    mergeFlops: (job.steps / job.mergeEvery) * work.whole.params * MERGE_FLOPS_PER_PARAM,
  };
  const pool = usableMiners(miners);
  const bySize = [...pool].sort((a, b) => a.memoryBytes - b.memoryBytes || a.gflops - b.gflops || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));

  const memories = memoriesDescending(pool);
  const candidates: JobLayout[] = [];
  for (const S of work.stageCounts) {
    for (const R of REPLICA_COUNTS) {
      if (S * R > pool.length) break;
      // the table keeps the figures; only default and chosen list their miners
      candidates.push({ ...evaluateLayout(ctx, S, R, pool, false, memories), assignment: [] });
    }
  }
  const holders = bySize.filter((m) => m.memoryBytes >= work.whole.memoryBytes.total);
  let def: JobLayout | null = null;
  if (holders.length > 0) {
    def = evaluateLayout(ctx, 1, 1, [holders[0]], false);
    def.why = `${holders.length === 1 ? 'the only miner' : `the smallest of the ${formatCount(holders.length)} miners`} that hold${holders.length === 1 ? 's' : ''} the whole model (${minerLabel(holders[0])})`;
  }
  const chosen = choose(ctx, candidates, pool, bySize, def);
  const budgetNim = job.budgetWei === null ? null : Number(job.budgetWei) / 1e18;
  const plan: JobPlan = {
    job: job.name,
    model: { kind: work.kind, name: work.name, summary: work.summary },
    unit: work.unit,
    params: work.whole.params,
    flopsPerItem: { ...work.whole.flopsPerToken },
    batchSize: job.batchSize,
    itemsPerStep: perStep,
    steps: job.steps,
    totalItems,
    mergeEvery: job.mergeEvery,
    slots: work.kind === 'gpt' ? slots : null,
    trainingFlops: ctx.trainingFlops,
    mergeFlops: ctx.mergeFlops,
    pricing: { nimPerPetaflop: pricing.nimPerPetaflop },
    deadlineMs: job.deadlineMs,
    budgetNim,
    wholeModel: breakdown(work.whole.memoryBytes),
    minMinerMemoryBytes: work.whole.memoryBytes.total,
    minPieceMemoryBytes: Math.max(...work.pieces().map((p) => p.bytes)),
    cuts: cuts(work),
    pool: {
      miners: miners.length,
      usable: pool.length,
      holdWhole: holders.length,
      largestMemoryBytes: pool.reduce((a, m) => Math.max(a, m.memoryBytes), 0),
      gflops: pool.reduce((a, m) => a + m.gflops, 0),
    },
    candidates,
    default: def,
    chosen,
    fits: chosen !== null,
    reason: chosen !== null ? null : pool.length === 0 ? 'no live miners' : noFitReason(work, candidates, pool),
    meetsDeadline: chosen?.meetsDeadline ?? false,
    withinBudget: budgetNim === null || chosen === null ? null : chosen.costNim <= budgetNim * (1 + 1e-12),
    explanation: [],
  };
  plan.explanation = explain(plan, ctx, pool);
  return plan;
}

/** Cost in NIM of `flops` at `pricing`. */
export function costNim(flops: number, pricing: JobPricing): number {
  return (flops / 1e15) * pricing.nimPerPetaflop;
}

// ---- the model ------------------------------------------------------------

function workload(model: JobModel, batchSize: number, slots: number): Workload {
  if (model.kind === 'mlp') {
    const config = { inputs: model.inputs, hidden: model.hidden, classes: model.classes };
    const whole = mlpCost(config, batchSize);
    return {
      kind: 'mlp',
      unit: 'example',
      name: null,
      summary: `MLP ${[model.inputs, ...model.hidden, model.classes].join('→')}`,
      whole,
      boundaryValues: 0,
      stageCounts: [1],
      parts: 1,
      cost: () => whole,
      cut: () => [null],
      pieces: () => [{ label: 'the whole MLP', bytes: whole.memoryBytes.total }],
    };
  }
  const config = model.config;
  const P = partCount(config);
  const table = stageCostTable(config, batchSize, slots);
  const cutCache = new Map<string, StageRange[]>();
  const stageCounts: number[] = [];
  for (let S = 1; S <= Math.min(P, MAX_EVERY_STAGE_COUNT); S++) stageCounts.push(S);
  for (let S = 24; S <= Math.min(P, MAX_STAGES); S = S < 32 ? 32 : S + S / 2) stageCounts.push(S);
  const { vocabSize: V, contextLength: T, channels: C, layers, heads } = config;
  return {
    kind: 'gpt',
    unit: 'token',
    name: model.name,
    summary: `${model.name ?? 'GPT'} (V ${V}, T ${T}, C ${C}, ${count(layers, 'layer')}, ${count(heads, 'head')})`,
    whole: table({ from: 0, to: P }),
    boundaryValues: C,
    stageCounts,
    parts: P,
    cost: (range) => table(range ?? { from: 0, to: P }),
    cut: (S, cap) => {
      const key = `${S}:${cap ?? ''}`;
      let ranges = cutCache.get(key);
      if (!ranges) {
        ranges = cutStages(config, S, cap === undefined ? {} : { maxStageMemoryBytes: cap, batchSize, slots });
        cutCache.set(key, ranges);
      }
      return ranges;
    },
    pieces: () => Array.from({ length: P }, (_, p) => ({ label: `part ${p} (${partName(config, p)})`, bytes: table({ from: p, to: p + 1 }).memoryBytes.total })),
  };
}

function breakdown(m: MemoryBytes): MemoryBreakdown {
  return { weights: m.weights, gradients: m.gradients, optimizer: m.optimizer, activations: m.activations, total: m.total };
}

function cuts(work: Workload): StageCut[] {
  return work.stageCounts.map((S) => {
    const needs = work.cut(S).map((range) => {
      const c = work.cost(range);
      return { range: range && { ...range }, params: c.params, flopsPerItem: { ...c.flopsPerToken }, memory: breakdown(c.memoryBytes) };
    });
    return { stages: S, needs, largestStageBytes: Math.max(...needs.map((n) => n.memory.total)) };
  });
}

// ---- layouts --------------------------------------------------------------

/** Miners that can work (a positive, finite GFLOP/s), each id once. */
function usableMiners(miners: readonly PoolMiner[]): PoolMiner[] {
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
function evaluateLayout(ctx: Context, S: number, R: number, pool: readonly PoolMiner[], balance: boolean, memories = memoriesDescending(pool)): JobLayout {
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
function memoriesDescending(pool: readonly PoolMiner[]): number[] {
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

/**
 * The layout to use: the cheapest that fits and meets the deadline (then the
 * fewest miners, the fewest stages), moved onto the shortest prefix of the
 * miners by size that still meets it; else the fastest that fits.
 */
function choose(ctx: Context, candidates: JobLayout[], pool: PoolMiner[], bySize: PoolMiner[], def: JobLayout | null): JobLayout | null {
  // a layout whose miners cannot send activations (no bandwidth) trains nothing
  const fitting = candidates.filter((c) => c.fitsMemory && c.itemsPerS > 0);
  if (fitting.length === 0) return null;
  const meeting = fitting.filter((c) => c.meetsDeadline);
  if (meeting.length === 0) {
    const fastest = fitting.reduce((a, c) => (c.itemsPerS > a.itemsPerS * (1 + 1e-9) ? c : a));
    const balanced = evaluateLayout(ctx, fastest.stages, fastest.replicas, pool, true);
    return { ...balanced, why: groupWhy(ctx, balanced, def, 'fastest') };
  }
  const cheapest = Math.min(...meeting.map((c) => c.costNim));
  const pick = meeting
    .filter((c) => c.costNim <= cheapest * (1 + COST_TIE))
    .sort((a, b) => a.miners - b.miners || a.stages - b.stages)[0];
  // the shortest prefix of the miners by size on which it still meets the deadline
  const ok = (k: number): boolean => {
    const l = evaluateLayout(ctx, pick.stages, pick.replicas, bySize.slice(0, k), false);
    return l.fitsMemory && l.meetsDeadline;
  };
  let lo = pick.miners;
  let hi = bySize.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (ok(mid)) hi = mid;
    else lo = mid + 1;
  }
  const best = evaluateLayout(ctx, pick.stages, pick.replicas, bySize.slice(0, hi), true);
  return { ...best, why: groupWhy(ctx, best, def, 'smallest') };
}

/** Why the chosen layout uses these miners. */
function groupWhy(ctx: Context, l: JobLayout, def: JobLayout | null, how: 'smallest' | 'fastest'): string {
  const deadline = formatDuration(ctx.job.deadlineMs);
  const miners = l.miners === 1 ? 'the smallest miner' : `the ${l.miners} smallest miners`;
  const pick = how === 'smallest' ? `${miners} (by memory, then speed) that fit and together meet the ${deadline} deadline` : `the fastest miners that fit: nothing meets the ${deadline} deadline`;
  if (l.stages === 1 && l.replicas === 1) return how === 'smallest' ? `the smallest miner that holds the whole model and meets the ${deadline} deadline` : pick;
  const forced =
    def === null
      ? `no single miner holds the model (it needs ${formatBytes(ctx.work.whole.memoryBytes.total)})`
      : def.wallTimeMs !== null && !def.meetsDeadline
        ? `one miner would take ${formatDuration(def.wallTimeMs)}`
        : null;
  return forced ? `${pick}; ${forced}` : pick;
}

// ---- words ----------------------------------------------------------------

function explain(plan: JobPlan, ctx: Context, pool: PoolMiner[]): string[] {
  const lines: string[] = [];
  const unit = plan.unit;
  const w = plan.wholeModel;
  const deadline = formatDuration(plan.deadlineMs);
  lines.push(
    `${plan.model.summary}: ${formatCount(plan.params)} parameters, ${formatFlops(totalFlops(plan.flopsPerItem))} per ${unit} (forward + backward); ` +
      `${formatCount(plan.steps)} steps × ${formatCount(plan.itemsPerStep)} ${unit}s = ${formatRate(plan.totalItems)} ${unit}s, ${formatFlops(plan.trainingFlops)} in all.`,
  );
  const acts = plan.slots === null ? `batch ${plan.batchSize}` : `batch ${plan.batchSize}, ${count(plan.slots, 'microbatch', 'microbatches')} in flight`;
  lines.push(
    `${formatBytes(w.total)} per replica with AdamW: weights ${formatBytes(w.weights)}, gradients ${formatBytes(w.gradients)}, ` +
      `optimizer ${formatBytes(w.optimizer)} (m, v, DiLoCo start weights and momentum), activations ${formatBytes(w.activations)} (${acts}).`,
  );
  const needRate = plan.totalItems / (plan.deadlineMs / 1000);
  lines.push(`The ${deadline} deadline needs ~${formatRate(needRate)} ${unit}s/s: ${formatSig((needRate * totalFlops(plan.flopsPerItem)) / 1e9)} GFLOP/s of compute in all.`);
  if (pool.length === 0) {
    const piece = ctx.work.kind === 'gpt' ? `, or ${formatBytes(plan.minPieceMemoryBytes)} per miner cut into ${ctx.work.parts} stages (the smallest pieces)` : '';
    lines.push(`No live miners to plan against: one miner needs ${formatBytes(plan.minMinerMemoryBytes)} to hold it alone${piece}.`);
  } else if (plan.pool.holdWhole > 0) {
    const first = pool.find((m) => m.id === plan.default!.assignment[0].miners[0])!;
    lines.push(`${plan.pool.holdWhole} of ${count(pool.length, 'live miner')} hold it alone; it starts on the smallest, ${minerLabel(first)}.`);
  } else {
    lines.push(`No single miner holds it: it needs ${formatBytes(plan.minMinerMemoryBytes)}, the largest of ${count(pool.length, 'live miner')} has ${formatBytes(plan.pool.largestMemoryBytes)}.`);
  }
  const d = plan.default;
  if (d && d.wallTimeMs !== null) {
    lines.push(`Alone there: ~${formatRate(d.itemsPerS)} ${unit}s/s, done in ${wallTime(d)}${d.meetsDeadline ? `, within the ${deadline} deadline` : `, missing the ${deadline} deadline`}.`);
  }
  const c = plan.chosen;
  if (c) {
    const shape = `${count(c.stages, 'stage')} × ${count(c.replicas, 'replica')}`;
    const speed = `~${formatRate(c.itemsPerS)} ${unit}s/s (${wallTime(c)}), ${formatNim(c.costNim)} NIM`;
    const same = d !== null && c.miners === 1 && d.assignment[0]?.miners[0] === c.assignment[0]?.miners[0];
    if (c.meetsDeadline && same) lines.push(`No upgrade needed: one miner meets the ${deadline} deadline at ${speed}.`);
    else if (c.meetsDeadline) lines.push(`${d ? 'Upgrade: ' : ''}${c.miners === 1 ? 'one larger miner meets' : `${shape} meet`} the ${deadline} deadline at ${speed}.`);
    else lines.push(`Nothing meets the ${deadline} deadline; the fastest layout that fits, ${shape}, takes ${wallTime(c)} at ~${formatRate(c.itemsPerS)} ${unit}s/s, ${formatNim(c.costNim)} NIM.`);
    if (!same) lines.push(`Miners: ${c.why}.`);
  } else if (pool.length > 0) {
    lines.push(`Cannot run on these miners: ${plan.reason}.`);
  }
  const merges = c && c.replicas >= 2 && plan.trainingFlops > 0 ? ` (merges add ${formatSig((plan.mergeFlops / plan.trainingFlops) * 100)}%)` : '';
  lines.push(
    `Cost: ${formatFlops(plan.trainingFlops)} × ${formatNim(plan.pricing.nimPerPetaflop)} NIM per PFLOP = ${formatNim(costNim(plan.trainingFlops, plan.pricing))} NIM${merges}, ` +
      `whatever the layout: an upgrade buys time, not NIM.`,
  );
  if (plan.withinBudget === false) lines.push(`Over budget: ${formatNim(c!.costNim)} NIM > ${formatNim(plan.budgetNim!)} NIM.`);
  return lines;
}

/** Why no layout fits, with the numbers. */
function noFitReason(work: Workload, candidates: JobLayout[], pool: PoolMiner[]): string {
  const largest = pool.reduce((a, m) => Math.max(a, m.memoryBytes), 0);
  const miners = count(pool.length, 'miner');
  if (work.kind === 'mlp') return `it needs ${formatBytes(work.whole.memoryBytes.total)} on one miner; the largest of ${miners} has ${formatBytes(largest)}`;
  for (const piece of work.pieces()) {
    if (piece.bytes > largest) return `${piece.label} alone needs ${formatBytes(piece.bytes)}; the largest of ${miners} has ${formatBytes(largest)}`;
  }
  if (candidates.some((c) => c.fitsMemory)) return 'the miners that could hold it report no upload bandwidth, and a layout of several miners must send activations or merges';
  const whole = `one miner needs ${formatBytes(work.whole.memoryBytes.total)} (the largest of ${miners} has ${formatBytes(largest)})`;
  // the fewest stages whose compute-balanced cut has no stage larger than the largest miner
  const S = work.stageCounts.find((n) => Math.max(...work.cut(n).map((r) => work.cost(r).memoryBytes.total)) <= largest);
  if (S === undefined) return `${whole}, and no cut into at most ${count(work.stageCounts[work.stageCounts.length - 1], 'stage')} fits it`;
  const per = Math.max(...work.cut(S).map((r) => work.cost(r).memoryBytes.total));
  if (S > pool.length) return `${whole}; cut into ${S} stages of at most ${formatBytes(per)} it needs ${S} miners, ${pool.length} available`;
  const layout = candidates.find((c) => c.stages === S && c.replicas === 1);
  return `${whole}; cut into ${S} stages: ${layout?.reason ?? `stages of up to ${formatBytes(per)} on ${miners}`}`;
}

/** The human view of a plan (`nbcli job plan`). */
export function formatJobPlan(plan: JobPlan): string {
  const unit = plan.unit === 'token' ? 'tok/s' : 'ex/s';
  const out: string[] = [`job ${plan.job}: ${plan.model.summary}`, ...plan.explanation.map((l) => `  ${l}`), ''];
  if (plan.cuts.length > 1) {
    out.push('memory per replica of the largest stage, by stage count:');
    out.push(`  ${plan.cuts.map((c) => `${c.stages}: ${formatBytes(c.largestStageBytes)}`).join('  ')}`);
    out.push('');
  }
  const fitting = plan.candidates.filter((c) => c.fitsMemory);
  if (fitting.length > 0) {
    const shown = fitting.slice(0, 24);
    const rows = shown.map((c) => [
      `${c.stages}×${c.replicas}`,
      String(c.miners),
      formatRate(c.itemsPerS),
      wallTime(c),
      formatNim(c.costNim),
      c.meetsDeadline ? 'yes' : 'no',
      c.limitedBy ?? '-',
      c.stages === plan.chosen?.stages && c.replicas === plan.chosen?.replicas ? '← chosen' : c.stages === 1 && c.replicas === 1 && plan.default ? '(default: 1 miner)' : '',
    ]);
    const head = ['S×R', 'miners', unit, 'time', 'NIM', `≤ ${formatDuration(plan.deadlineMs)}`, 'limit', ''];
    const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
    out.push('layouts on the live miners (fastest miners for each):');
    for (const r of [head, ...rows]) out.push(`  ${r.map((x, i) => (i === 0 || i >= 5 ? x.padEnd(widths[i]) : x.padStart(widths[i]))).join('  ').trimEnd()}`);
    const hidden = plan.candidates.length - shown.length;
    if (hidden > 0) out.push(`  (${hidden} more: ${fitting.length - shown.length} that fit, ${plan.candidates.length - fitting.length} that do not)`);
    out.push('');
  }
  if (plan.chosen) {
    const c = plan.chosen;
    out.push(`chosen: ${c.stages} × ${c.replicas} on ${count(c.miners, 'miner')}`);
    for (const s of c.assignment) {
      const range = s.range ? `[${s.range.from},${s.range.to}) ` : '';
      out.push(`  ${range}${formatBytes(s.memoryBytes)}: ${s.miners.join(', ')} (~${formatRate(s.itemsPerS)} ${unit}, ${s.limitedBy})`);
    }
  }
  return out.join('\n').trimEnd();
}

/** How long a layout takes; "never" when a stage cannot move its activations (no bandwidth). */
function wallTime(l: JobLayout): string {
  return l.wallTimeMs === null ? (l.fitsMemory ? 'never' : '-') : formatDuration(l.wallTimeMs);
}

function minerLabel(m: PoolMiner): string {
  return `${m.name ?? m.id}: ${formatBytes(m.memoryBytes)}, ${formatSig(m.gflops)} GFLOP/s`;
}

function count(n: number, one: string, many = `${one}s`): string {
  return `${formatCount(n)} ${n === 1 ? one : many}`;
}

/** 867,072 */
function formatCount(n: number): string {
  return String(Math.round(n)).replace(/\B(?=(\d{3})+(?!\d))/g, ',');
}

/** Three significant digits, no exponent for ordinary magnitudes. */
function formatSig(x: number): string {
  if (x === 0) return '0';
  if (Math.abs(x) >= 1000) return formatCount(x);
  return String(Number(x.toPrecision(3)));
}

/** 40.3k, 1.2M, 512 */
function formatRate(x: number): string {
  if (x >= 1e9) return `${formatSig(x / 1e9)}G`;
  if (x >= 1e6) return `${formatSig(x / 1e6)}M`;
  if (x >= 1e3) return `${formatSig(x / 1e3)}k`;
  return formatSig(x);
}

function formatFlops(x: number): string {
  const units = ['FLOP', 'kFLOP', 'MFLOP', 'GFLOP', 'TFLOP', 'PFLOP', 'EFLOP'];
  let u = 0;
  while (x >= 1000 && u < units.length - 1) {
    x /= 1000;
    u++;
  }
  return `${formatSig(x)} ${units[u]}`;
}

function formatNim(x: number): string {
  return formatSig(x);
}
