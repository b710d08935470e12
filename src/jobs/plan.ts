// The "upgrade" analysis of one job (`nbcli job plan`): what the model needs
// (parameters, FLOPs per token or per example, memory per stage broken down),
// which layouts of S pipeline stages × R replicas the live miners allow, how
// fast each would train and what it would cost, which one to use and on
// which miners, and a few lines saying why. Pure: the caller brings the job
// and the miners' measured figures. A `JobPlan` is plain JSON data with a
// TypeBox schema, so it can travel over HTTP.
//
// The parts: plan-schema.ts (the JSON types), plan-constants.ts (pricing and
// the planner's figures), plan-workload.ts (the model's costs and cuts),
// plan-layouts.ts (S × R layouts over miners: throughput and wall time),
// plan-choice.ts (which layout), plan-words.ts (the explanation and
// formatJobPlan). The work hardly depends on the layout, so neither does
// the cost (merges add MERGE_FLOPS_PER_PARAM per parameter per round when
// replicas merge: 0.002% for gpt-tiny at the default mergeEvery): an upgrade
// buys time, not NIM. `default` is one miner, the smallest that holds the
// whole model: the job starts there, and "upgrade" moves it to `chosen`.
import { totalFlops } from '../planner/cost.ts';
import { choose } from './plan-choice.ts';
import { DEFAULT_PRICING, JOB_SLOTS, MERGE_FLOPS_PER_PARAM, REPLICA_COUNTS } from './plan-constants.ts';
import { formatCount, minerLabel } from './plan-format.ts';
import { evaluateLayout, memoriesDescending, usableMiners } from './plan-layouts.ts';
import type { JobLayout, JobPlan, JobPricing, PlanJobOptions, PoolMiner } from './plan-schema.ts';
import { breakdown, cuts, workload, type Context } from './plan-workload.ts';
import { explain, noFitReason } from './plan-words.ts';
import { itemsPerStep, type ResolvedJob } from './spec.ts';

export {
  ACTIVATION_BYTES,
  COST_TIE,
  DEFAULT_PRICING,
  JOB_SLOTS,
  MAX_EVERY_STAGE_COUNT,
  MAX_STAGES,
  MERGE_FLOPS_PER_PARAM,
  MERGE_FRAME_BYTES_PER_PARAM,
  REPLICA_COUNTS,
  costNim,
} from './plan-constants.ts';
export { JobLayout, JobPlan, JobPricing, LayoutStage, MemoryBreakdown, StageCut, StageNeed, type PlanJobOptions, type PoolMiner } from './plan-schema.ts';
export { formatJobPlan } from './plan-words.ts';

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
