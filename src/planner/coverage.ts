// Whether miners can give every stage its minimum replicas. Memory
// eligibility is nested (a miner fits every stage needing no more memory than
// it has), so this is Hall's condition on memory levels: for each level, the
// miners with at least that much must outnumber the replicas still needed by
// the stages that need at least that much.
import { formatBytes } from './errors.ts';
import type { MinerCapacity } from './types.ts';

/** A stage as the assigner sees it. */
export interface StageDemand {
  /** forward + backward FLOPs per token */
  flopsPerToken: number;
  memoryBytes: number;
  /** how messages name the stage, e.g. "stage 2 [3,5)" */
  label: string;
}

/** Stages whose minimum replicas the pool cannot supply, with the numbers. */
export interface CoverageGap {
  /** stage indices needing at least `memoryBytes` */
  stages: number[];
  memoryBytes: number;
  /** replicas those stages still need */
  need: number;
  /** miners with at least `memoryBytes` */
  have: number;
}

/**
 * Hall's condition for nested eligibility: can miners with memories `pool`
 * give each stage `deficit[s]` more replicas? Returns null if so, else the
 * first memory level where the need exceeds the miners.
 */
export function coverageGap(stages: readonly StageDemand[], deficit: readonly number[], pool: readonly number[]): CoverageGap | null {
  if (!deficit.some((d) => d > 0)) return null;
  return coverageGapSorted(stages, deficit, [...pool].sort((a, b) => b - a));
}

/** coverageGap for a pool already sorted by memory, largest first. */
export function coverageGapSorted(stages: readonly StageDemand[], deficit: readonly number[], mem: readonly number[]): CoverageGap | null {
  const order = stages.map((_, s) => s).filter((s) => deficit[s] > 0).sort((a, b) => stages[b].memoryBytes - stages[a].memoryBytes);
  if (order.length === 0) return null;
  let need = 0;
  let have = 0;
  for (let k = 0; k < order.length; k++) {
    const level = stages[order[k]].memoryBytes;
    need += deficit[order[k]];
    while (have < mem.length && mem[have] >= level) have++;
    if (have < need) return { stages: order.slice(0, k + 1), memoryBytes: level, need, have };
  }
  return null;
}

/**
 * Why no assignment gives every stage `minReplicas` fitting replicas, or null
 * if one exists. The message names the numbers.
 */
export function diagnoseAssignment(stages: readonly StageDemand[], miners: readonly MinerCapacity[], minReplicas: number): string | null {
  const S = stages.length;
  if (miners.length < S * minReplicas) {
    const per = minReplicas === 1 ? '' : ` with ${minReplicas} replicas each`;
    const n = S * minReplicas;
    return `${S} stage${S === 1 ? '' : 's'}${per} need${S === 1 ? 's' : ''} at least ${n} miner${n === 1 ? '' : 's'}; ${miners.length} available`;
  }
  const largest = miners.reduce((m, x) => Math.max(m, x.memoryBytes), 0);
  const tooBig = stages.filter((s) => s.memoryBytes > largest);
  if (tooBig.length > 0) {
    const list = tooBig.map((s) => `${s.label} needs ${formatBytes(s.memoryBytes)}`).join(', ');
    return `${list}; the largest miner has ${formatBytes(largest)}`;
  }
  const gap = coverageGap(stages, stages.map(() => minReplicas), miners.map((m) => m.memoryBytes));
  if (gap) {
    const list = gap.stages.map((s) => stages[s].label).join(', ');
    const top = [...miners].sort((a, b) => b.memoryBytes - a.memoryBytes).slice(0, gap.have + 1);
    const tops = top.map((m) => `${m.id} ${formatBytes(m.memoryBytes)}`).join(', ');
    const one = gap.stages.length === 1;
    return `${list} need${one ? 's' : ''} ${formatBytes(gap.memoryBytes)} or more per replica, ${gap.need} replicas in all, ` +
      `but only ${gap.have} of ${miners.length} miners ${gap.have === 1 ? 'has' : 'have'} that much memory (largest: ${tops})`;
  }
  return null;
}
