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
// - speed: forward FLOPs per token only, and upload bandwidth: a replica
//   sends one row per generated token to the orchestrator (an activation row
//   in f16, or the last stage's logits in f32), so it serves at most its
//   upload over those bytes; a miner's serving rate is the lesser of the two,
//   and a miner that reports no upload bandwidth serves nothing;
// - a deployment takes exactly `replicas` miners per stage (training takes
//   every miner that fits): the fastest miners that keep every stage coverable;
// - the stage count, when not given, is the fewest that fit: every stage
//   boundary is a network hop for every generated token.
import { blockWidths } from '../model/arch.ts';
import type { GptConfig } from '../model/config.ts';
import { validateGptConfig } from '../model/config.ts';
import { headPart, partCount, partParamCount, type StageRange } from '../model/parts.ts';
import { assignMiners, diagnoseAssignment, stageThroughput, validateMiners, type StageDemand } from '../planner/assign.ts';
import { BYTES_PER_FLOAT, partFlopsPerToken } from '../planner/cost.ts';
import { formatBytes, PlanError } from '../planner/errors.ts';
import { cutStages, DEFAULT_EXACT_SEARCH_LIMIT, stageLabel } from '../planner/placement.ts';
import type { MinerCapacity } from '../planner/types.ts';
import { kvCacheBytes } from './kv-cache.ts';

/** A miner that may serve: what it offers, and its measured upload bandwidth. */
export interface ServingMiner extends MinerCapacity {
  /** Mbit/s */
  bandwidthMbps: number;
}

/**
 * Bytes a replica of the stage sends per generated token: its activation row
 * in f16 (the serving path's default frames), or on the last stage the
 * token's logits in f32. A prompt's rows are sent once per request, and the
 * frame's header (about 100 bytes) once per step for all its sessions: left out.
 */
export function uploadBytesPerToken(config: GptConfig, range: StageRange): number {
  return range.to === partCount(config) ? config.vocabSize * 4 : config.channels * 2;
}

/** What a stage asks of a replica's speed. */
export interface StageLoad {
  flopsPerToken: number;
  uploadBytesPerToken: number;
}

/** Tokens/s a miner serves a stage at: what its compute allows or what its upload allows, whichever is less. */
export function servingRate(m: ServingMiner, load: StageLoad): number {
  const compute = stageThroughput(m.gflops, load.flopsPerToken);
  const upload = Number.isFinite(m.bandwidthMbps) && m.bandwidthMbps > 0 ? (m.bandwidthMbps * 1e6) / 8 / load.uploadBytesPerToken : 0;
  return Math.min(compute, upload);
}

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
  const w = blockWidths(config);
  let params = 0;
  let flops = 0;
  for (let p = range.from; p < range.to; p++) {
    params += partParamCount(config, p);
    flops += partFlopsPerToken(config, p).forward;
  }
  const blocks = Math.max(0, Math.min(range.to, headPart(config)) - Math.max(range.from, 1));
  const rows = Math.max(T, sessions);
  const last = range.to === P;
  // x, res2, ln, tmp (C each), atty (H·D), mean and rstd, qkv, fch and its activation (src/model/block.ts's cachedScratch), the row table (2 ints); the last stage's rows and logits
  const scratchFloats = rows * (4 * C + w.attn + 2 + w.qkv + w.fc + w.hidden + 2) + (last ? rows * (C + V) : 0);
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
  /** bytes a replica sends per generated token */
  uploadBytesPerToken: number;
  /** tokens per second its replicas generate together (each at the lesser of its compute and its upload) */
  throughputTokensPerS: number;
  /** what bounds the stage: its replicas' compute or their upload */
  limitedBy: 'compute' | 'upload';
}

export interface DeploymentPlan {
  stages: DeploymentStagePlan[];
  /** the slowest stage's tokens per second */
  bottleneckTokensPerS: number;
}

export interface DeploymentPlanInput {
  config: GptConfig;
  /** the miners that may serve it (alive, serving inference, holding nothing else) */
  miners: ServingMiner[];
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
  const { config, miners, replicas } = input;
  validateGptConfig(config);
  validateMiners(miners);
  if (!(Number.isInteger(replicas) && replicas >= 1)) throw new RangeError(`replicas must be a positive integer, got ${replicas}`);
  const P = partCount(config);
  if (input.stages !== undefined && !(Number.isInteger(input.stages) && input.stages >= 1 && input.stages <= P)) {
    throw new RangeError(`stages must be an integer in [1, ${P}], got ${input.stages}`);
  }
  if (miners.length === 0) throw new PlanError('no miner serving inference is free');
  const usable = miners.filter((m) => Number.isFinite(m.bandwidthMbps) && m.bandwidthMbps > 0);
  if (usable.length === 0) throw new PlanError(`the ${miners.length} free miner${miners.length === 1 ? '' : 's'} serving inference report no upload bandwidth: a stage sends a row for every generated token`);
  return planOn(input, usable);
}

function planOn(input: DeploymentPlanInput, miners: ServingMiner[]): DeploymentPlan {
  const { config, replicas, sessions } = input;
  const P = partCount(config);
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
    const loads = ranges.map((range, s): StageLoad => ({ flopsPerToken: demands[s].flopsPerToken, uploadBytesPerToken: uploadBytesPerToken(config, range) }));
    const picked = pickMiners(demands, miners, replicas, (m, s) => servingRate(m, loads[s]));
    const result = assignMiners(demands, picked, { minReplicas: replicas, exactSearchLimit: DEFAULT_EXACT_SEARCH_LIMIT });
    const stages = ranges.map((range, s): DeploymentStagePlan => {
      const held = picked.filter((_, i) => result.stageOf[i] === s);
      const cost = inferenceStageCost(config, range, sessions);
      const compute = stageThroughput(held.reduce((a, m) => a + m.gflops, 0), cost.flopsPerToken);
      const served = held.reduce((a, m) => a + servingRate(m, loads[s]), 0);
      return {
        range: { ...range },
        params: cost.params,
        memoryBytes: cost.memoryBytes.total,
        flopsPerToken: cost.flopsPerToken,
        miners: held.map((m) => m.id),
        uploadBytesPerToken: loads[s].uploadBytesPerToken,
        throughputTokensPerS: served,
        limitedBy: served < compute ? 'upload' : 'compute',
      };
    });
    return { stages, bottleneckTokensPerS: Math.min(...stages.map((s) => s.throughputTokensPerS)) };
  }
  throw new PlanError(input.stages !== undefined || counts.length === 1 ? reason : `no stage count up to ${counts.length} fits: ${reason}`);
}

/**
 * `replicas` miners per stage out of `miners`, fastest first (by `rate` on
 * the stage: its GFLOP/s unless given): the stages needing the most memory
 * choose first, each the fastest miners that fit it. Memory eligibility is
 * nested (a miner that fits a stage fits every stage needing less), so this
 * picks a coverable set whenever one exists (diagnoseAssignment said so),
 * whatever the rate.
 */
export function pickMiners<M extends MinerCapacity>(demands: readonly StageDemand[], miners: readonly M[], replicas: number, rate: (m: M, stage: number) => number = (m) => m.gflops): M[] {
  const order = demands.map((_, s) => s).sort((a, b) => demands[b].memoryBytes - demands[a].memoryBytes);
  const left = [...miners];
  const picked: M[] = [];
  for (const s of order) {
    left.sort((a, b) => rate(b, s) - rate(a, s) || b.gflops - a.gflops || (a.id < b.id ? -1 : 1));
    for (let r = 0; r < replicas; r++) {
      const i = left.findIndex((m) => m.memoryBytes >= demands[s].memoryBytes);
      if (i < 0) throw new PlanError(`${demands[s].label} needs a miner with ${formatBytes(demands[s].memoryBytes)}; none is left`);
      picked.push(...left.splice(i, 1));
    }
  }
  return picked;
}

/**
 * The fastest of `candidates` (by serving rate on the stage) that fit a
 * stage needing `memoryBytes` and can upload, at most `count` of them
 * (replacing replicas that left).
 */
export function pickReplacements(memoryBytes: number, load: StageLoad, candidates: readonly ServingMiner[], count: number): ServingMiner[] {
  return candidates
    .filter((m) => m.memoryBytes >= memoryBytes && servingRate(m, load) > 0)
    .sort((a, b) => servingRate(b, load) - servingRate(a, load) || b.gflops - a.gflops || (a.id < b.id ? -1 : 1))
    .slice(0, Math.max(0, count));
}
