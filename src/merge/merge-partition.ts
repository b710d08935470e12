// Merging one partition, the one way every party computes it: the mergers
// (two miners per partition) and the orchestrator when it checks a merged
// result. The replicas' slices, in a canonical order (by miner id), are each
// clipped to the round's norm bound, then aggregated (a weighted mean by the
// inner steps each replica was credited, or a robust aggregate). Pure and
// deterministic: two honest mergers upload bitwise the same frame.
//
// The norm bound keeps one replica from moving the merged weights far: a
// pseudo-gradient larger than CLIP_FACTOR × the median of the replicas'
// norms of this partition (with the previous round's median as one more
// voice, so two replicas are not left to outvote each other) is scaled down
// to it. Honest replicas of a stage train the same number of steps at the same
// learning rate from the same weights, so their norms are close: the figure
// `merge.honest_norm_spread.*` of `npm run bench -- --only trust` measure how
// close (docs/security.md).
import { aggregate, type AggregatorName } from './aggregate.ts';
import { MergeError } from './errors.ts';

/** A slice larger than this many times the median norm is scaled down to it. */
export const CLIP_FACTOR = 2;

/** How a round merges its partitions (fixed when merging starts, the same for every merger). */
export interface MergeRule {
  aggregator: AggregatorName;
  /** trimmed-mean only: fraction dropped at each end */
  trim: number;
  /** largest L2 norm a replica's slice keeps (null: no bound) */
  maxNorm: number | null;
}

/** One replica's slice of a partition. */
export interface ReplicaSlice {
  minerId: string;
  slice: Float32Array;
  /** inner steps the replica was credited (the weight of a mean) */
  samples: number;
}

/** The aggregate a round uses by default: a mean of two replicas, with three or more a trimmed mean that drops at least one replica at each end. */
export function defaultRule(replicas: number): { aggregator: 'mean' | 'trimmed-mean'; trim: number } {
  if (replicas < 3) return { aggregator: 'mean', trim: 0 };
  return { aggregator: 'trimmed-mean', trim: Math.max(1, Math.floor(0.2 * replicas)) / replicas };
}

/** L2 norm, summed in float64. */
export function l2Norm(x: Float32Array): number {
  let s = 0;
  for (let i = 0; i < x.length; i++) s += x[i] * x[i];
  return Math.sqrt(s);
}

/** `x` scaled down to norm `maxNorm` when larger (a copy), else `x` itself. */
export function clipToNorm(x: Float32Array, maxNorm: number): Float32Array {
  const n = l2Norm(x);
  if (!(n > maxNorm)) return x;
  const scale = maxNorm / n;
  const out = new Float32Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = x[i] * scale;
  return out;
}

/** The norm bound of a partition: CLIP_FACTOR × the median of the replicas' norms and the previous round's median. */
export function normBound(norms: readonly number[], previousMedian: number | null): number {
  const all = previousMedian === null ? [...norms] : [...norms, previousMedian];
  if (all.length === 0) throw new MergeError('no_replicas', 'no norms to bound');
  return CLIP_FACTOR * median(all);
}

export function median(values: readonly number[]): number {
  const s = [...values].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}

/** Merges one partition from its replicas' slices under `rule`. */
export function mergeSlices(inputs: readonly ReplicaSlice[], rule: MergeRule): Float32Array {
  if (inputs.length === 0) throw new MergeError('no_replicas', 'nothing to merge');
  const ordered = [...inputs].sort((a, b) => (a.minerId < b.minerId ? -1 : a.minerId > b.minerId ? 1 : 0));
  const slices = ordered.map((r) => (rule.maxNorm === null ? r.slice : clipToNorm(r.slice, rule.maxNorm)));
  const samples = ordered.map((r) => r.samples);
  const weights = samples.some((w) => w > 0) ? samples : samples.map(() => 1);
  return aggregate(slices, { method: rule.aggregator, weights, trim: rule.trim });
}
