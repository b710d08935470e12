// Rebalancing a running plan when miners join or leave, SWARM-style: the
// stage cuts stay, and as few miners as possible download a new stage.
//
// 1. Departed miners are dropped; a miner whose memory no longer fits its
//    stage is freed.
// 2. A stage left without replicas gets the fastest free miner that fits it,
//    else one replica taken from the stage with the most slack (the move that
//    leaves the higher of the two throughputs as high as possible).
// 3. Free miners (new ones first among equals) go, fastest first, to the
//    fitting stage with the lowest throughput.
// 4. A stage that departures left with a single replica gets a second one
//    from a stage with three or more (the move that leaves the bottleneck
//    highest), gain or not: one more departure would stop the pipeline, and a
//    lone replica's merges are checked against nobody's.
// 5. Up to `maxMoves` replicas already in place move (or swap, counting 2),
//    each only if it raises the bottleneck throughput by more than `minGain`,
//    and never so that a stage drops to a single replica while the stage it
//    joins had two or more: redundancy, as in step 4, comes before speed.
//
// Moves of step 2 count towards `maxMoves` but are never skipped: a stage with
// no replica stops the pipeline. Moves of step 4 take from the same budget
// before step 5.
import { stageThroughput, validateMiners } from './assign.ts';
import { totalFlops } from './cost.ts';
import { PlanError, formatBytes } from './errors.ts';
import type { MinerCapacity, Move, Plan, PlannedStage } from './types.ts';

export interface RebalanceOptions {
  /** most replicas already in place that may move (default 2) */
  maxMoves?: number;
  /** a voluntary move must raise the bottleneck throughput by more than this fraction (default 0.1) */
  minGain?: number;
}

export interface Rebalanced {
  plan: Plan;
  /** miners whose stage changed (from null: joins; to null: leaves its stage), in the order of `miners` */
  moves: Move[];
  /** miners of the previous plan missing from `miners` */
  departed: string[];
}

/** Default most moves of miners already in place. */
export const DEFAULT_MAX_MOVES = 2;
/** Default least relative gain of the bottleneck for a voluntary move. */
export const DEFAULT_MIN_GAIN = 0.1;

/**
 * Rebalances `previous` for the miners present now (`miners`, with their
 * current capacities). Keeps the stage cuts; returns the new plan and the
 * moves to announce. Throws PlanError when a stage cannot get a replica.
 */
export function rebalance(previous: Plan, miners: MinerCapacity[], opts: RebalanceOptions = {}): Rebalanced {
  const maxMoves = opts.maxMoves ?? DEFAULT_MAX_MOVES;
  const minGain = opts.minGain ?? DEFAULT_MIN_GAIN;
  if (!(Number.isInteger(maxMoves) && maxMoves >= 0)) throw new RangeError(`maxMoves must be an integer ≥ 0, got ${maxMoves}`);
  if (!(minGain >= 0)) throw new RangeError(`minGain must be ≥ 0, got ${minGain}`);
  validateMiners(miners);
  const byId = new Map<string, MinerCapacity>(miners.map((m) => [m.id, m]));

  const stages = previous.stages;
  const S = stages.length;
  const work = stages.map((s) => totalFlops(s.flopsPerToken));
  const was = new Map<string, number>();
  stages.forEach((s, i) => s.miners.forEach((id) => was.set(id, i)));
  const departed = [...was.keys()].filter((id) => !byId.has(id));

  // 1. keep present miners that still fit
  const holders: string[][] = stages.map((s) => s.miners.filter((id) => byId.has(id) && byId.get(id)!.memoryBytes >= s.memoryBytes));
  const at = new Map<string, number>();
  holders.forEach((ids, s) => ids.forEach((id) => at.set(id, s)));
  const sum = holders.map((ids) => ids.reduce((a, id) => a + byId.get(id)!.gflops, 0));
  const tp = (s: number, extra = 0): number => stageThroughput(sum[s] + extra, work[s]);
  const fits = (id: string, s: number): boolean => byId.get(id)!.memoryBytes >= stages[s].memoryBytes;
  const put = (id: string, s: number): void => {
    const old = at.get(id);
    if (old !== undefined) {
      holders[old].splice(holders[old].indexOf(id), 1);
      sum[old] -= byId.get(id)!.gflops;
    }
    holders[s].push(id);
    sum[s] += byId.get(id)!.gflops;
    at.set(id, s);
  };
  // fastest first; among equals, the order given
  let free = miners.filter((m) => !at.has(m.id)).sort((a, b) => b.gflops - a.gflops).map((m) => m.id);

  // 2. stages left without a replica, the hardest to fill (most memory) first
  let forced = 0;
  const empty = holders.map((_, s) => s).filter((s) => holders[s].length === 0).sort((a, b) => stages[b].memoryBytes - stages[a].memoryBytes);
  for (const e of empty) {
    const pick = free.find((id) => fits(id, e));
    if (pick !== undefined) {
      free = free.filter((id) => id !== pick);
      put(pick, e);
      continue;
    }
    let donor: { id: string; value: number } | null = null;
    for (let d = 0; d < S; d++) {
      if (d === e || holders[d].length < 2) continue;
      for (const id of holders[d]) {
        if (!fits(id, e)) continue;
        const g = byId.get(id)!.gflops;
        const value = Math.min(tp(d, -g), stageThroughput(g, work[e]));
        if (!donor || value > donor.value) donor = { id, value };
      }
    }
    if (!donor) throw new PlanError(emptyStageReason(previous, e, miners));
    put(donor.id, e);
    forced++;
  }

  // 3. free miners, fastest first, where throughput is lowest
  for (const id of free) {
    let best = -1;
    for (let s = 0; s < S; s++) {
      if (!fits(id, s)) continue;
      if (best < 0 || tp(s) < tp(best) || (tp(s) === tp(best) && work[s] > work[best])) best = s;
    }
    if (best >= 0) put(id, best);
  }

  let budget = Math.max(0, maxMoves - forced);
  const bottleneck = (): number => Math.min(...Array.from({ length: S }, (_, s) => tp(s)));
  const movable = (id: string): boolean => was.get(id) === at.get(id);
  /** The bottleneck after adding GFLOP/s to stages: [stage, gflops][]. */
  const after = (changes: [number, number][]): number => {
    let m = Infinity;
    for (let s = 0; s < S; s++) {
      let extra = 0;
      for (const [cs, g] of changes) if (cs === s) extra += g;
      m = Math.min(m, tp(s, extra));
    }
    return m;
  };
  /** The movable miner whose move into stage t, from a stage whose replica count `donorOk` accepts, leaves the bottleneck highest. */
  const bestMoveInto = (t: number, donorOk: (replicas: number) => boolean): { id: string; value: number } | null => {
    let best: { id: string; value: number } | null = null;
    for (let a = 0; a < S; a++) {
      if (a === t || !donorOk(holders[a].length)) continue;
      for (const id of holders[a]) {
        if (!movable(id) || !fits(id, t)) continue;
        const g = byId.get(id)!.gflops;
        const value = after([[a, -g], [t, g]]);
        if (!best || value > best.value) best = { id, value };
      }
    }
    return best;
  };

  // 4. stages that departures left with one replica, the hardest to fill first
  const thinned = holders.map((_, s) => s)
    .filter((s) => holders[s].length === 1 && stages[s].miners.length >= 2)
    .sort((a, b) => stages[b].memoryBytes - stages[a].memoryBytes);
  for (const t of thinned) {
    if (budget === 0) break;
    const donor = bestMoveInto(t, (n) => n >= 3);
    if (!donor) continue;
    put(donor.id, t);
    budget--;
  }

  // 5. voluntary moves of miners still at their old stage
  while (budget > 0) {
    const now = bottleneck();
    const b = Array.from({ length: S }, (_, s) => s).reduce((x, y) => (tp(y) < tp(x) ? y : x));
    // a donor keeps two replicas, or gives its second to a stage that had one (2 + 1 becomes 1 + 2)
    const single = bestMoveInto(b, (n) => n >= 3 || (n === 2 && holders[b].length === 1));
    if (single && single.value > now * (1 + minGain)) {
      put(single.id, b);
      budget--;
      continue;
    }
    if (budget < 2) break;
    let swap: { x: string; y: string; value: number } | null = null;
    for (const y of holders[b]) {
      if (!movable(y)) continue;
      const gy = byId.get(y)!.gflops;
      for (let a = 0; a < S; a++) {
        if (a === b) continue;
        for (const x of holders[a]) {
          const gx = byId.get(x)!.gflops;
          if (gx <= gy || !movable(x) || !fits(x, b) || !fits(y, a)) continue;
          const value = after([[a, gy - gx], [b, gx - gy]]);
          if (!swap || value > swap.value) swap = { x, y, value };
        }
      }
    }
    if (!swap || swap.value <= now * (1 + minGain)) break;
    const a = at.get(swap.x)!;
    put(swap.x, b);
    put(swap.y, a);
    budget -= 2;
  }

  const planStages: PlannedStage[] = stages.map((s, i) => ({
    range: { ...s.range },
    params: s.params,
    flopsPerToken: { ...s.flopsPerToken },
    memoryBytes: s.memoryBytes,
    miners: [...holders[i]],
    throughputTokensPerS: tp(i),
  }));
  const plan: Plan = {
    stages: planStages,
    bottleneckTokensPerS: Math.min(...planStages.map((s) => s.throughputTokensPerS)),
    unassigned: miners.filter((m) => !at.has(m.id)).map((m) => m.id),
  };
  const moves: Move[] = [];
  for (const m of miners) {
    const from = was.get(m.id) ?? null;
    const to = at.get(m.id) ?? null;
    if (from !== to) moves.push({ miner: m.id, from, to });
  }
  return { plan, moves, departed };
}

/** Why stage e cannot get a replica: what it needs against the free miners and the spare replicas. */
function emptyStageReason(previous: Plan, e: number, miners: MinerCapacity[]): string {
  const st = previous.stages[e];
  const largest = miners.reduce((m, x) => Math.max(m, x.memoryBytes), 0);
  return `stage ${e} [${st.range.from},${st.range.to}) lost its last replica and needs ${formatBytes(st.memoryBytes)}; ` +
    `no free miner fits it and no stage with 2 or more replicas has one that does (largest miner: ${formatBytes(largest)})`;
}
