// The model as a plan sees it (a Workload): its whole cost, its stages' costs
// and how it can be cut (every stage count up to the model's parts, or a
// spread of them for deep models; 1 for the MLP, which is never cut), and
// what planning one job shares across its layouts (a Context).
import { partCount, partName, StageRange } from '../model/parts.ts';
import { stageCostTable, type MemoryBytes, type StageCost } from '../planner/cost.ts';
import { cutStages } from '../planner/placement.ts';
import { mlpCost } from './mlp-cost.ts';
import { MAX_EVERY_STAGE_COUNT, MAX_STAGES } from './plan-constants.ts';
import { count } from './plan-format.ts';
import type { JobPricing, MemoryBreakdown, StageCut } from './plan-schema.ts';
import type { JobModel, ResolvedJob } from './spec.ts';

/** The model as the plan sees it: costs of its stages and how it can be cut. */
export interface Workload {
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
export interface Context {
  job: ResolvedJob;
  work: Workload;
  pricing: JobPricing;
  totalItems: number;
  trainingFlops: number;
  mergeFlops: number;
}

export function workload(model: JobModel, batchSize: number, slots: number): Workload {
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

export function breakdown(m: MemoryBytes): MemoryBreakdown {
  return { weights: m.weights, gradients: m.gradients, optimizer: m.optimizer, activations: m.activations, total: m.total };
}

export function cuts(work: Workload): StageCut[] {
  return work.stageCounts.map((S) => {
    const needs = work.cut(S).map((range) => {
      const c = work.cost(range);
      return { range: range && { ...range }, params: c.params, flopsPerItem: { ...c.flopsPerToken }, memory: breakdown(c.memoryBytes) };
    });
    return { stages: S, needs, largestStageBytes: Math.max(...needs.map((n) => n.memory.total)) };
  });
}
