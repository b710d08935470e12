// The planner's figures (`nbcli job plan`): the default price of work, what
// a replica sends and computes per merge, the layouts tried and when costs
// tie. Pricing: a job pays for the work it needs, cost in NIM = total
// training FLOPs × the price in NIM per petaflop (1e15 FLOPs); DEFAULT_PRICING
// is 1 NIM per PFLOP, so a miner sustaining 100 GFLOP/s (0.36 PFLOP an hour)
// earns about 0.36 NIM an hour, 8.6 NIM a day, while it trains.
import type { JobPricing } from './plan-schema.ts';

/** 1 NIM per PFLOP: a miner sustaining 100 GFLOP/s earns about 0.36 NIM per hour of training. */
export const DEFAULT_PRICING: JobPricing = { nimPerPetaflop: 1 };

/** Keeping an ended job's checkpoints longer (`nbcli checkpoint keep`) costs this much NIM per GB (1e9 bytes) per day added. */
export const STORAGE_NIM_PER_GB_DAY = 0.1;
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

/** Cost in NIM of `flops` at `pricing`. */
export function costNim(flops: number, pricing: JobPricing): number {
  return (flops / 1e15) * pricing.nimPerPetaflop;
}
