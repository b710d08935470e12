// Assigning miners to stages whose cuts are fixed. The objective is the
// pipeline's bottleneck: a stage's throughput is the sum of its replicas'
// GFLOP/s over its FLOPs per token, and we make the slowest stage as fast as
// possible, subject to memory (a miner holds only a stage that fits it) and a
// minimum number of replicas per stage.
//
// 1. Greedy: miners fastest first, each to the fitting stage with the lowest
//    throughput (an empty stage has throughput 0, so every stage gets a replica
//    first), unless that would leave a stage unable to reach its minimum
//    replicas with the miners still to place.
// 2. Local search: move a miner into the bottleneck stage, or swap a slow
//    replica of the bottleneck stage for a faster one, while that raises the
//    bottleneck stage without dropping the other below its old value.
// 3. Target search: binary search on a throughput every stage must reach,
//    covering the stages that need the most memory first (coverTarget), the
//    rest as in 1, then 2; kept if better. This repairs the greedy's weak
//    spot: a fast miner with much memory spent on a stage anyone could hold.
// 4. Branch and bound over every assignment, seeded with that result, for up
//    to `exactSearchLimit` nodes and EXACT_MAX_MINERS miners: exact on small
//    networks, never worse than 3.
//
// Memory eligibility is nested (a miner fits every stage needing no more
// memory than it has), so whether the remaining miners can still give every
// stage its minimum replicas is Hall's condition on prefixes: for each memory
// level, the miners with at least that much must outnumber the replicas still
// needed by the stages that need at least that much.
import { coverageGapSorted, diagnoseAssignment, type StageDemand } from './coverage.ts';
import { PlanError } from './errors.ts';
import type { MinerCapacity } from './types.ts';
import { Untaken } from './untaken.ts';

export { coverageGap, diagnoseAssignment, type CoverageGap, type StageDemand } from './coverage.ts';

export interface AssignOptions {
  /** replicas every stage must get (≥ 1) */
  minReplicas: number;
  /** nodes the exact search may visit after the heuristic; 0 = heuristic only */
  exactSearchLimit: number;
}

export interface AssignResult {
  /** stage of each miner, in the order given; -1 = fits no stage */
  stageOf: number[];
  /** tokens per second of each stage */
  throughput: number[];
  /** the lowest stage throughput */
  bottleneck: number;
  /** true when the exact search finished: no assignment has a higher bottleneck */
  optimal: boolean;
}

/** Rejects malformed miner records (they come from registration, so this is a caller bug). */
export function validateMiners(miners: readonly MinerCapacity[]): void {
  const seen = new Set<string>();
  for (const m of miners) {
    if (typeof m.id !== 'string' || m.id.length === 0) throw new RangeError('miner id must be a non-empty string');
    if (seen.has(m.id)) throw new RangeError(`miner ${m.id} is listed twice`);
    seen.add(m.id);
    if (!(Number.isFinite(m.gflops) && m.gflops > 0)) throw new RangeError(`miner ${m.id}: gflops must be a positive number, got ${m.gflops}`);
    if (!(Number.isFinite(m.memoryBytes) && m.memoryBytes >= 0)) throw new RangeError(`miner ${m.id}: memoryBytes must be ≥ 0, got ${m.memoryBytes}`);
  }
}

/** Tokens per second of a stage whose replicas add up to `gflops`. */
export function stageThroughput(gflops: number, flopsPerToken: number): number {
  return (gflops * 1e9) / flopsPerToken;
}

/**
 * Assigns every miner that fits some stage to one stage, maximizing the
 * lowest stage throughput. Throws PlanError (with the numbers) when the
 * stages cannot all get `minReplicas` replicas.
 */
export function assignMiners(stages: readonly StageDemand[], miners: readonly MinerCapacity[], options: AssignOptions): AssignResult {
  const why = diagnoseAssignment(stages, miners, options.minReplicas);
  if (why) throw new PlanError(why);
  const state = new State(stages, miners, options.minReplicas);
  state.greedy();
  state.improve();
  state.searchTargets();
  const optimal = options.exactSearchLimit > 0 ? state.exactSearch(options.exactSearchLimit) : false;
  return { stageOf: state.result(), throughput: state.throughputs(), bottleneck: state.bottleneck(), optimal };
}

const EPS = 1e-12;
/** The exact search runs only up to this many miners (beyond, the heuristic is within a fraction of a percent of the fluid bound). */
export const EXACT_MAX_MINERS = 24;

/** The mutable search state; miners are indexed in order of decreasing speed. */
class State {
  private readonly S: number;
  /** GFLOP per token of each stage */
  private readonly work: number[];
  private readonly memory: number[];
  /** miner indices (into the input) fastest first, only those fitting some stage */
  private readonly order: number[];
  private readonly gflops: number[];
  private readonly mem: number[];
  private readonly sum: number[];
  private readonly count: number[];
  /** stage of order[i] */
  private stageOf: number[];
  private best: { stageOf: number[]; bottleneck: number } | null = null;
  /** memories of order[from..], largest first (see suffixMemory) */
  private suffix: { from: number; mem: number[] } = { from: Infinity, mem: [] };

  constructor(
    private readonly stages: readonly StageDemand[],
    private readonly miners: readonly MinerCapacity[],
    private readonly minReplicas: number,
  ) {
    this.S = stages.length;
    this.work = stages.map((s) => s.flopsPerToken / 1e9);
    this.memory = stages.map((s) => s.memoryBytes);
    const smallest = Math.min(...this.memory);
    this.order = miners
      .map((_, i) => i)
      .filter((i) => miners[i].memoryBytes >= smallest)
      .sort((a, b) => miners[b].gflops - miners[a].gflops || miners[a].memoryBytes - miners[b].memoryBytes || (miners[a].id < miners[b].id ? -1 : 1));
    this.gflops = this.order.map((i) => miners[i].gflops);
    this.mem = this.order.map((i) => miners[i].memoryBytes);
    this.sum = new Array<number>(this.S).fill(0);
    this.count = new Array<number>(this.S).fill(0);
    this.stageOf = new Array<number>(this.order.length).fill(-1);
  }

  /** tokens per second of stage s: GFLOP/s over GFLOP per token */
  private tp(s: number): number {
    return this.sum[s] / this.work[s];
  }

  private fits(i: number, s: number): boolean {
    return this.mem[i] >= this.memory[s];
  }

  private place(i: number, s: number): void {
    this.stageOf[i] = s;
    this.sum[s] += this.gflops[i];
    this.count[s]++;
  }

  private unplace(i: number): void {
    const s = this.stageOf[i];
    this.stageOf[i] = -1;
    this.sum[s] -= this.gflops[i];
    this.count[s]--;
  }

  private deficits(): number[] {
    return this.count.map((c) => Math.max(0, this.minReplicas - c));
  }

  /** Can miners order[from..] still give every stage its minimum replicas? */
  private coverable(from: number): boolean {
    const d = this.deficits();
    if (d.every((x) => x === 0)) return true;
    return coverageGapSorted(this.stages, d, this.suffixMemory(from)) === null;
  }

  /** Memories of order[from..], largest first; kept between calls as `from` grows (the greedy's scan), rebuilt otherwise. */
  private suffixMemory(from: number): number[] {
    if (from < this.suffix.from) this.suffix = { from: 0, mem: [...this.mem].sort((a, b) => b - a) };
    const mem = this.suffix.mem;
    for (let k = this.suffix.from; k < from; k++) {
      // remove one copy of mem[k] (binary search in the descending list)
      let lo = 0;
      let hi = mem.length;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (mem[mid] > this.mem[k]) lo = mid + 1;
        else hi = mid;
      }
      mem.splice(lo, 1);
    }
    this.suffix.from = from;
    return mem;
  }

  /** Stages miner i fits, lowest throughput first (ties: the heavier stage). */
  private candidates(i: number): number[] {
    const c: number[] = [];
    for (let s = 0; s < this.S; s++) if (this.fits(i, s)) c.push(s);
    return c.sort((a, b) => this.tp(a) - this.tp(b) || this.work[b] - this.work[a] || a - b);
  }

  greedy(): void {
    for (let i = 0; i < this.order.length; i++) {
      const cands = this.candidates(i);
      let placed = false;
      for (const s of cands) {
        this.place(i, s);
        if (this.coverable(i + 1)) {
          placed = true;
          break;
        }
        this.unplace(i);
      }
      // cannot happen when the initial diagnosis passed (Hall's condition holds throughout)
      if (!placed) throw new PlanError('internal: greedy assignment lost feasibility');
    }
  }

  /** Places the unplaced miners, fastest first, on the fitting stage with the lowest throughput. */
  private fillRest(): void {
    for (let i = 0; i < this.order.length; i++) {
      if (this.stageOf[i] < 0) this.place(i, this.candidates(i)[0]);
    }
  }

  /**
   * Tries to give every stage at least `target` tokens/s and its minimum
   * replicas: stages needing the most memory first (they have the fewest
   * candidates; any miner they leave fits every later stage), each covered
   * by the fastest eligible miners until one more can close the gap, then by
   * the slowest miner that closes it. False if some stage cannot be covered.
   */
  private coverTarget(target: number): boolean {
    this.stageOf.fill(-1);
    this.sum.fill(0);
    this.count.fill(0);
    const stages = Array.from({ length: this.S }, (_, s) => s).sort((a, b) => this.memory[b] - this.memory[a] || this.work[b] - this.work[a]);
    // Miners are indexed fastest first, so "slowest first" scans go down
    // from n − 1, skipping placed miners (Untaken) instead of rescanning them.
    const n = this.order.length;
    const free = new Untaken(n);
    /** The slowest unplaced miner at or faster than i that fits s, or -1. */
    const slowestFitting = (i: number, s: number): number => {
      for (let k = free.atOrBelow(i); k >= 0; k = free.atOrBelow(k - 1)) if (this.fits(k, s)) return k;
      return -1;
    };
    for (const s of stages) {
      const need = (): number => target * this.work[s] - this.sum[s];
      // within a stage, the slowest fitting unplaced miner only gets faster
      let cursor = n - 1;
      while (need() > 1e-12 * target * this.work[s] || this.count[s] < this.minReplicas) {
        let pick: number;
        if (need() <= 0 || this.count[s] + 1 < this.minReplicas) {
          // enough speed already, or more replicas to come: the slowest eligible
          pick = cursor = slowestFitting(cursor, s);
        } else {
          // the slowest that closes the gap, else the fastest (GFLOP/s do not increase with the index)
          const g = need();
          let lo = 0;
          let hi = n;
          while (lo < hi) {
            const mid = (lo + hi) >> 1;
            if (this.gflops[mid] >= g) lo = mid + 1;
            else hi = mid;
          }
          pick = slowestFitting(lo - 1, s);
          if (pick < 0) {
            for (let k = free.atOrAbove(0); k < n; k = free.atOrAbove(k + 1)) {
              if (this.fits(k, s)) {
                pick = k;
                break;
              }
            }
          }
        }
        if (pick < 0) return false;
        this.place(pick, s);
        free.take(pick);
      }
    }
    return true;
  }

  /** Binary search on a common target throughput with coverTarget; keeps whichever assignment (this one or the current) has the higher bottleneck. */
  searchTargets(): void {
    let best = { stageOf: [...this.stageOf], bottleneck: this.bottleneck() };
    const total = this.gflops.reduce((a, b) => a + b, 0);
    const work = this.work.reduce((a, b) => a + b, 0);
    let lo = best.bottleneck;
    let hi = total / work;
    for (let iter = 0; iter < 40 && hi > lo * (1 + 1e-9); iter++) {
      const mid = (lo + hi) / 2;
      if (this.coverTarget(mid)) {
        this.fillRest();
        const v = this.bottleneck();
        if (v > best.bottleneck) best = { stageOf: [...this.stageOf], bottleneck: v };
        lo = Math.max(mid, v);
      } else {
        hi = mid;
      }
    }
    this.restore(best.stageOf);
    this.improve();
  }

  private restore(stageOf: number[]): void {
    this.stageOf.fill(-1);
    this.sum.fill(0);
    this.count.fill(0);
    for (let i = 0; i < stageOf.length; i++) if (stageOf[i] >= 0) this.place(i, stageOf[i]);
  }

  bottleneck(): number {
    let m = Infinity;
    for (let s = 0; s < this.S; s++) m = Math.min(m, this.tp(s));
    return m;
  }

  private bottleneckStage(): number {
    let b = 0;
    for (let s = 1; s < this.S; s++) if (this.tp(s) < this.tp(b)) b = s;
    return b;
  }

  /** Moves and swaps that raise the bottleneck stage without pushing the other stage below it. */
  improve(): void {
    const limit = 10 * (this.order.length + 1) * (this.S + 1);
    for (let iter = 0; iter < limit; iter++) {
      const b = this.bottleneckStage();
      const tb = this.tp(b);
      let bestGain = tb * (1 + EPS);
      let move: { i: number; j: number } | null = null; // j = -1: single move of i into b
      for (let i = 0; i < this.order.length; i++) {
        const a = this.stageOf[i];
        if (a === b || !this.fits(i, b) || this.count[a] <= this.minReplicas) continue;
        const v = Math.min((this.sum[a] - this.gflops[i]) / this.work[a], (this.sum[b] + this.gflops[i]) / this.work[b]);
        if (v > bestGain) {
          bestGain = v;
          move = { i, j: -1 };
        }
      }
      if (!move) {
        for (let j = 0; j < this.order.length; j++) {
          if (this.stageOf[j] !== b) continue;
          for (let i = 0; i < this.order.length; i++) {
            const a = this.stageOf[i];
            if (a === b || this.gflops[i] <= this.gflops[j] || !this.fits(i, b) || !this.fits(j, a)) continue;
            const d = this.gflops[i] - this.gflops[j];
            const v = Math.min((this.sum[a] - d) / this.work[a], (this.sum[b] + d) / this.work[b]);
            if (v > bestGain) {
              bestGain = v;
              move = { i, j };
            }
          }
        }
      }
      if (!move) return;
      const a = this.stageOf[move.i];
      this.unplace(move.i);
      if (move.j >= 0) {
        this.unplace(move.j);
        this.place(move.j, a);
      }
      this.place(move.i, b);
    }
  }

  /** Branch and bound from the current (heuristic) assignment; true if it finished. */
  exactSearch(limit: number): boolean {
    this.best = { stageOf: [...this.stageOf], bottleneck: this.bottleneck() };
    const n = this.order.length;
    const suffix = new Array<number>(n + 1).fill(0);
    for (let i = n - 1; i >= 0; i--) suffix[i] = suffix[i + 1] + this.gflops[i];
    for (let i = 0; i < n; i++) if (this.stageOf[i] >= 0) this.unplace(i);
    if (this.waterLevel(suffix[0]) <= this.best.bottleneck * (1 + EPS) || n > EXACT_MAX_MINERS) {
      // already at the fluid bound (optimal), or too many miners to enumerate
      this.restore(this.best.stageOf);
      return n <= EXACT_MAX_MINERS || this.waterLevel(suffix[0]) <= this.best.bottleneck * (1 + EPS);
    }
    let nodes = 0;
    let aborted = false;
    const dfs = (i: number): void => {
      if (aborted) return;
      if (++nodes > limit) {
        aborted = true;
        return;
      }
      if (i === n) {
        const v = this.bottleneck();
        if (v > this.best!.bottleneck * (1 + EPS) && this.deficits().every((x) => x === 0)) {
          this.best = { stageOf: [...this.stageOf], bottleneck: v };
        }
        return;
      }
      if (this.waterLevel(suffix[i]) <= this.best!.bottleneck * (1 + EPS)) return;
      if (!this.coverable(i)) return;
      const seen = new Set<string>();
      for (const s of this.candidates(i)) {
        const key = `${this.work[s]}|${this.memory[s]}|${this.sum[s]}|${this.count[s]}`;
        if (seen.has(key)) continue;
        seen.add(key);
        this.place(i, s);
        dfs(i + 1);
        this.unplace(i);
        if (aborted) return;
      }
    };
    dfs(0);
    this.restore(this.best.stageOf);
    return !aborted;
  }

  /** Upper bound on the bottleneck if `spare` more GFLOP/s could be poured into stages at will (water filling). */
  private waterLevel(spare: number): number {
    const idx = Array.from({ length: this.S }, (_, s) => s).sort((a, b) => this.tp(a) - this.tp(b));
    let W = 0;
    let G = 0;
    for (let k = 0; k < idx.length; k++) {
      W += this.work[idx[k]];
      G += this.sum[idx[k]];
      const level = (spare + G) / W;
      if (k === idx.length - 1 || level <= this.tp(idx[k + 1])) return level;
    }
    return Infinity;
  }

  throughputs(): number[] {
    return Array.from({ length: this.S }, (_, s) => this.tp(s));
  }

  result(): number[] {
    const out = new Array<number>(this.miners.length).fill(-1);
    for (let i = 0; i < this.order.length; i++) out[this.order[i]] = this.stageOf[i];
    return out;
  }
}
