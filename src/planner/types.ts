// Shapes shared by the planner's modules: what a miner offers and what a plan says.
import type { StageRange } from '../model/gpt.ts';
import type { FlopsPerToken } from './cost.ts';

/** What a miner offers, as measured when it registered. */
export interface MinerCapacity {
  id: string;
  /** measured effective GFLOP/s, already reflecting throttling */
  gflops: number;
  /** memory the miner can give a stage, in bytes */
  memoryBytes: number;
}

/** One stage of a plan: the parts it holds, what it costs, and who holds it. */
export interface PlannedStage {
  range: StageRange;
  params: number;
  flopsPerToken: FlopsPerToken;
  /** total bytes a replica needs (weights, gradients, optimizer state, activations) */
  memoryBytes: number;
  /** replicas, by miner id */
  miners: string[];
  /** sum of the replicas' GFLOP/s · 1e9 / (forward + backward FLOPs per token) */
  throughputTokensPerS: number;
}

/** Who holds which stage. Plain data: it serializes as JSON. */
export interface Plan {
  stages: PlannedStage[];
  /** throughput of the slowest stage: the pipeline's training tokens per second */
  bottleneckTokensPerS: number;
  /** miners present but given no stage (no stage fits their memory) */
  unassigned: string[];
}

/** A miner changing stage: from null = joins, to null = leaves its stage. */
export interface Move {
  miner: string;
  from: number | null;
  to: number | null;
}
