// The plain-JSON types of a job plan (TypeBox schemas, so a `JobPlan` can
// travel over HTTP), the live miners it is planned on, and the price of work.
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { StageRange } from '../model/parts.ts';
import { FlopsPerToken } from '../planner/types.ts';

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
