// Brute-force references for the planner tests.
import type { GptConfig } from '../../src/model/config.ts';
import { partCount, type StageRange } from '../../src/model/parts.ts';
import { partFlopsPerToken, totalFlops } from '../../src/planner/cost.ts';
import type { MinerCapacity } from '../../src/planner/types.ts';

/** Every way to cut P parts into S contiguous non-empty ranges. */
export function allCuts(parts: number, stages: number): StageRange[][] {
  const out: StageRange[][] = [];
  const rec = (from: number, left: number, acc: StageRange[]): void => {
    if (left === 1) {
      out.push([...acc, { from, to: parts }]);
      return;
    }
    for (let to = from + 1; to <= parts - (left - 1); to++) rec(to, left - 1, [...acc, { from, to }]);
  };
  rec(0, stages, []);
  return out;
}

/** Forward + backward FLOPs per token of a range. */
export function rangeFlops(config: GptConfig, r: StageRange): number {
  let f = 0;
  for (let p = r.from; p < r.to; p++) f += totalFlops(partFlopsPerToken(config, p));
  return f;
}

/** The smallest possible largest stage FLOPs over all cuts. */
export function bruteForceMaxFlops(config: GptConfig, stages: number): number {
  return Math.min(...allCuts(partCount(config), stages).map((cut) => Math.max(...cut.map((r) => rangeFlops(config, r)))));
}

/** The best bottleneck (tokens/s) over every assignment of miners to stages, or -1 if none is valid. */
export function bruteForceBottleneck(
  stages: { flopsPerToken: number; memoryBytes: number }[],
  miners: MinerCapacity[],
  minReplicas = 1,
): number {
  const S = stages.length;
  const at = new Array<number>(miners.length).fill(-1);
  let best = -1;
  const rec = (i: number): void => {
    if (i === miners.length) {
      const sum = new Array<number>(S).fill(0);
      const count = new Array<number>(S).fill(0);
      at.forEach((s, k) => {
        if (s >= 0) {
          sum[s] += miners[k].gflops;
          count[s]++;
        }
      });
      if (count.some((c) => c < minReplicas)) return;
      best = Math.max(best, Math.min(...sum.map((g, s) => (g * 1e9) / stages[s].flopsPerToken)));
      return;
    }
    let any = false;
    for (let s = 0; s < S; s++) {
      if (miners[i].memoryBytes < stages[s].memoryBytes) continue;
      any = true;
      at[i] = s;
      rec(i + 1);
    }
    at[i] = -1;
    if (!any) rec(i + 1);
  };
  rec(0);
  return best;
}

/** A small deterministic random generator (LCG), for reproducible cases. */
export function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

/** Miners with the given GFLOP/s, all with `memoryBytes`. */
export function minersOf(gflops: number[], memoryBytes: number): MinerCapacity[] {
  return gflops.map((g, i) => ({ id: `m${i}`, gflops: g, memoryBytes }));
}
