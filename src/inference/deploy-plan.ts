// Placing a deployed GPT on miners (docs/inference.md, "Deploy"): cut it into
// stages and pick `replicas` miners for each, with the training planner's
// pieces (src/planner/): cutStages for balanced cuts, diagnoseAssignment for
// the reasons a placement cannot fit, assignMiners to spread the picked
// miners' speed over the stages. What differs from training is the cost of a
// stage and who is picked:
//
// - memory: an inference stage holds its weights, a KV cache for each of
//   `sessions` sessions (2 · T · C floats per block, ./kv-cache.ts) and the
//   activation buffers of one call of `maxRows` rows (./stage-inference.ts);
//   no gradients, optimizer state or activations kept for a backward pass;
// - speed: forward FLOPs per token only;
// - a deployment takes exactly `replicas` miners per stage (training takes
//   every miner that fits): the fastest miners that keep every stage coverable;
// - the stage count, when not given, is the fewest that fit: every stage
//   boundary is a network hop for every generated token.
import type { GptConfig } from '../model/config.ts';
import { validateGptConfig } from '../model/config.ts';
import { headPart, partCount, partParamCount, type StageRange } from '../model/gpt.ts';
import { assignMiners, diagnoseAssignment, stageThroughput, validateMiners, type StageDemand } from '../planner/assign.ts';
import { BYTES_PER_FLOAT, partFlopsPerToken } from '../planner/cost.ts';
import { formatBytes, PlanError } from '../planner/errors.ts';
import { cutStages, DEFAULT_EXACT_SEARCH_LIMIT, stageLabel } from '../planner/placement.ts';
import type { MinerCapacity } from '../planner/types.ts';
import { kvCacheBytes } from './kv-cache.ts';

/** Sessions a deployed stage keeps room for (StageInference's default). */
export const DEFAULT_DEPLOY_SESSIONS = 16;

/** Bytes a stage of a deployment needs on its miner. */
export interface InferenceMemory {
  weights: number;
  /** every session's KV cache */
  kvCache: number;
  /** the activation buffers of one call */
  scratch: number;
  total: number;
}

export interface InferenceStageCost {
  params: number;
  /** forward FLOPs per token (a generated token crosses each stage once) */
  flopsPerToken: number;
  memoryBytes: InferenceMemory;
}

/** What StageInference allocates for parts `range` with room for `sessions` sessions (its default maxRows). */
export function inferenceStageCost(config: GptConfig, range: StageRange, sessions: number): InferenceStageCost {
  validateGptConfig(config);
  const P = partCount(config);
  if (!(Number.isInteger(range.from) && Number.isInteger(range.to) && 0 <= range.from && range.from < range.to && range.to <= P)) {
    throw new RangeError(`bad stage range [${range.from}, ${range.to}) for ${P} parts`);
  }
  if (!(Number.isInteger(sessions) && sessions >= 1)) throw new RangeError(`sessions must be a positive integer, got ${sessions}`);
  const { contextLength: T, channels: C, vocabSize: V } = config;
  const H = C * config.mlpRatio;
  let params = 0;
  let flops = 0;
  for (let p = range.from; p < range.to; p++) {
    params += partParamCount(config, p);
    flops += partFlopsPerToken(config, p).forward;
  }
  const blocks = Math.max(0, Math.min(range.to, headPart(config)) - Math.max(range.from, 1));
  const rows = Math.max(T, sessions);
  const last = range.to === P;
  // x, res2, ln, atty, tmp (C each), mean and rstd, qkv (3C), fch and its GELU (H each), the row table (2 ints); the last stage's rows and logits
  const scratchFloats = rows * (8 * C + 2 + 2 * H + 2) + (last ? rows * (C + V) : 0);
  const weights = params * BYTES_PER_FLOAT;
  const kvCache = sessions * kvCacheBytes(config, blocks);
  const scratch = scratchFloats * BYTES_PER_FLOAT;
  return { params, flopsPerToken: flops, memoryBytes: { weights, kvCache, scratch, total: weights + kvCache + scratch } };
}

/** One stage of a deployment's plan. */
export interface DeploymentStagePlan {
  range: StageRange;
  params: number;
  memoryBytes: number;
  /** forward FLOPs per token */
  flopsPerToken: number;
  /** its replicas, by miner id */
  miners: string[];
  /** tokens per second its replicas generate together */
  throughputTokensPerS: number;
}

export interface DeploymentPlan {
  stages: DeploymentStagePlan[];
  /** the slowest stage's tokens per second */
  bottleneckTokensPerS: number;
}

export interface DeploymentPlanInput {
  config: GptConfig;
  /** the miners that may serve it (alive, serving inference, holding nothing else) */
  miners: MinerCapacity[];
  replicas: number;
  /** the stage count (default: the fewest that fit) */
  stages?: number;
  /** sessions each stage keeps room for */
  sessions: number;
}

/** The demand of each stage of a cut, as the assigner sees it. */
export function inferenceDemands(config: GptConfig, ranges: readonly StageRange[], sessions: number): StageDemand[] {
  return ranges.map((range, s) => {
    const cost = inferenceStageCost(config, range, sessions);
    return { flopsPerToken: cost.flopsPerToken, memoryBytes: cost.memoryBytes.total, label: stageLabel(s, range) };
  });
}

/**
 * Cuts the model and picks `replicas` miners per stage. Throws PlanError with
 * the numbers when no stage count (or not the one asked for) fits the miners.
 */
export function planDeployment(input: DeploymentPlanInput): DeploymentPlan {
  const { config, miners, replicas, sessions } = input;
  validateGptConfig(config);
  validateMiners(miners);
  if (!(Number.isInteger(replicas) && replicas >= 1)) throw new RangeError(`replicas must be a positive integer, got ${replicas}`);
  const P = partCount(config);
  if (input.stages !== undefined && !(Number.isInteger(input.stages) && input.stages >= 1 && input.stages <= P)) {
    throw new RangeError(`stages must be an integer in [1, ${P}], got ${input.stages}`);
  }
  if (miners.length === 0) throw new PlanError('no miner serving inference is free');
  const counts = input.stages !== undefined ? [input.stages] : Array.from({ length: Math.max(1, Math.min(P, Math.floor(miners.length / replicas))) }, (_, i) => i + 1);
  let reason = '';
  for (const S of counts) {
    const ranges = cutStages(config, S);
    const demands = inferenceDemands(config, ranges, sessions);
    const why = diagnoseAssignment(demands, miners, replicas);
    if (why) {
      reason = why;
      continue;
    }
    const picked = pickMiners(demands, miners, replicas);
    const result = assignMiners(demands, picked, { minReplicas: replicas, exactSearchLimit: DEFAULT_EXACT_SEARCH_LIMIT });
    const stages = ranges.map((range, s) => {
      const held = picked.filter((_, i) => result.stageOf[i] === s);
      const cost = inferenceStageCost(config, range, sessions);
      return {
        range: { ...range },
        params: cost.params,
        memoryBytes: cost.memoryBytes.total,
        flopsPerToken: cost.flopsPerToken,
        miners: held.map((m) => m.id),
        throughputTokensPerS: stageThroughput(held.reduce((a, m) => a + m.gflops, 0), cost.flopsPerToken),
      };
    });
    return { stages, bottleneckTokensPerS: Math.min(...stages.map((s) => s.throughputTokensPerS)) };
  }
  throw new PlanError(input.stages !== undefined || counts.length === 1 ? reason : `no stage count up to ${counts.length} fits: ${reason}`);
}

/**
 * `replicas` miners per stage out of `miners`, fastest first: the stages
 * needing the most memory choose first, each the fastest miners that fit it.
 * Memory eligibility is nested (a miner that fits a stage fits every stage
 * needing less), so this picks a coverable set whenever one exists
 * (diagnoseAssignment said so).
 */
export function pickMiners(demands: readonly StageDemand[], miners: readonly MinerCapacity[], replicas: number): MinerCapacity[] {
  const order = demands.map((_, s) => s).sort((a, b) => demands[b].memoryBytes - demands[a].memoryBytes);
  const left = [...miners].sort((a, b) => b.gflops - a.gflops || (a.id < b.id ? -1 : 1));
  const picked: MinerCapacity[] = [];
  for (const s of order) {
    for (let r = 0; r < replicas; r++) {
      const i = left.findIndex((m) => m.memoryBytes >= demands[s].memoryBytes);
      if (i < 0) throw new PlanError(`${demands[s].label} needs a miner with ${formatBytes(demands[s].memoryBytes)}; none is left`);
      picked.push(...left.splice(i, 1));
    }
  }
  return picked;
}

/** The fastest of `candidates` that fit a stage needing `memoryBytes`, at most `count` of them (replacing replicas that left). */
export function pickReplacements(memoryBytes: number, candidates: readonly MinerCapacity[], count: number): MinerCapacity[] {
  return candidates
    .filter((m) => m.memoryBytes >= memoryBytes)
    .sort((a, b) => b.gflops - a.gflops || (a.id < b.id ? -1 : 1))
    .slice(0, Math.max(0, count));
}
