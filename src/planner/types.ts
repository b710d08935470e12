// Shapes shared by the planner's modules: what a miner offers and what a plan
// says. A plan is plain data that the orchestrator stores as JSON, so its
// shape is a TypeBox schema (validate a stored plan with
// `parse(Plan, value)` from src/protocol/messages.ts) and its type is derived
// from the schema.
import { Type, type Static } from '@sinclair/typebox';
import { StageRange } from '../model/parts.ts';

/** What a miner offers, as measured when it registered. */
export interface MinerCapacity {
  id: string;
  /** measured effective GFLOP/s, already reflecting throttling */
  gflops: number;
  /** memory the miner can give a stage, in bytes */
  memoryBytes: number;
}

/** FLOPs to process one token, forward and backward. */
export const FlopsPerToken = Type.Object({
  forward: Type.Number({ minimum: 0 }),
  backward: Type.Number({ minimum: 0 }),
});
export type FlopsPerToken = Static<typeof FlopsPerToken>;

/** One stage of a plan: the parts it holds, what it costs, and who holds it. */
export const PlannedStage = Type.Object({
  range: StageRange,
  params: Type.Integer({ minimum: 0 }),
  flopsPerToken: FlopsPerToken,
  /** total bytes a replica needs (weights, gradients, optimizer state, activations) */
  memoryBytes: Type.Integer({ minimum: 0 }),
  /** replicas, by miner id */
  miners: Type.Array(Type.String()),
  /** sum of the replicas' GFLOP/s · 1e9 / (forward + backward FLOPs per token) */
  throughputTokensPerS: Type.Number({ minimum: 0 }),
});
export type PlannedStage = Static<typeof PlannedStage>;

/** Who holds which stage. Plain data: it serializes as JSON. */
export const Plan = Type.Object({
  stages: Type.Array(PlannedStage, { minItems: 1 }),
  /** throughput of the slowest stage: the pipeline's training tokens per second */
  bottleneckTokensPerS: Type.Number({ minimum: 0 }),
  /** miners present but given no stage (no stage fits their memory) */
  unassigned: Type.Array(Type.String()),
});
export type Plan = Static<typeof Plan>;

/** A miner changing stage: from null = joins, to null = leaves its stage. */
export interface Move {
  miner: string;
  from: number | null;
  to: number | null;
}
