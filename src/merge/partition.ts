// Partitions of a stage's flat parameter vector and who merges each one.
//
// The vector [0, n) is cut into P contiguous partitions whose boundaries fall
// on int8 block boundaries (multiples of the pseudo-gradient block size), so a
// partition's slice of a pseudo-gradient is a whole number of int8 blocks and
// is encoded, decoded and error-corrected on its own, with exactly the blocks
// (and scales) the whole vector would have.
//
// Each partition is merged by `redundancy` distinct replicas (2 by default,
// butterfly all-reduce with redundancy as in IOTA / SWARM). The assignment is
// balanced (merge loads differ by at most one) and spreads the pairs, so that
// losing any two replicas orphans as few partitions as possible.

import { DEFAULT_BLOCK_SIZE } from '../protocol/codec.ts';
import { MergeError } from './errors.ts';

/** One partition: the half-open range [start, end) of the flat vector. */
export interface Partition {
  /** Position in the partition list, 0-based. */
  readonly index: number;
  /** First element (a multiple of the block size). */
  readonly start: number;
  /** One past the last element (a multiple of the block size, or n). */
  readonly end: number;
}

/** For each partition (by index) the replica ids that merge it. */
export type MergerAssignment = readonly (readonly string[])[];

/** Most partitions a vector of `n` values can be cut into: one per int8 block. */
export function maxPartitions(n: number, blockSize: number = DEFAULT_BLOCK_SIZE): number {
  checkCount('n', n, 1);
  checkCount('blockSize', blockSize, 1);
  return Math.ceil(n / blockSize);
}

/**
 * Cuts [0, n) into `count` contiguous partitions of nearly equal size whose
 * boundaries are multiples of `blockSize` (the last partition ends at n).
 * Block counts of two partitions differ by at most one. Throws MergeError
 * 'bad_argument' when `count` exceeds the number of blocks.
 */
export function partitionVector(n: number, count: number, blockSize: number = DEFAULT_BLOCK_SIZE): Partition[] {
  const blocks = maxPartitions(n, blockSize);
  checkCount('partition count', count, 1);
  if (count > blocks) {
    throw new MergeError('bad_argument', `cannot cut ${n} values (${blocks} blocks of ${blockSize}) into ${count} partitions`);
  }
  const out: Partition[] = [];
  for (let i = 0; i < count; i++) {
    const b0 = Math.floor((i * blocks) / count);
    const b1 = Math.floor(((i + 1) * blocks) / count);
    out.push({ index: i, start: b0 * blockSize, end: Math.min(b1 * blockSize, n) });
  }
  return out;
}

/**
 * Checks that `partitions` are indexed 0..P-1 in order, tile [0, n) exactly,
 * and start on multiples of `blockSize` (ends too, except at n). Throws
 * MergeError 'misaligned' or 'bad_argument'.
 */
export function checkPartitions(partitions: readonly Partition[], n: number, blockSize: number): void {
  if (partitions.length === 0) throw new MergeError('bad_argument', 'no partitions');
  let expected = 0;
  for (let i = 0; i < partitions.length; i++) {
    const p = partitions[i];
    if (p.index !== i) throw new MergeError('bad_argument', `partition at position ${i} has index ${p.index}`);
    if (p.start !== expected || !(p.end > p.start)) {
      throw new MergeError('bad_argument', `partition ${i} is [${p.start}, ${p.end}), expected to start at ${expected} and be non-empty`);
    }
    if (p.start % blockSize !== 0 || (p.end % blockSize !== 0 && p.end !== n)) {
      throw new MergeError('misaligned', `partition ${i} [${p.start}, ${p.end}) is not aligned to blocks of ${blockSize}`);
    }
    expected = p.end;
  }
  if (expected !== n) throw new MergeError('bad_argument', `partitions cover [0, ${expected}), the vector has ${n} values`);
}

/**
 * Picks the mergers of each of `partitions` partitions among `replicas`:
 * min(redundancy, replicas.length) distinct replicas per partition. Every
 * replica merges floor or ceil of partitions * redundancy / replicas
 * partitions, and pairs are spread (a pair shares as few partitions as the
 * balance allows). The result depends only on the set of replica ids (their
 * order is irrelevant), the counts and `seed`, so every party computes the
 * same assignment.
 */
export function assignMergers(partitions: number, replicas: readonly string[], redundancy: number = 2, seed: number | string = 0): string[][] {
  checkCount('partition count', partitions, 1);
  checkCount('redundancy', redundancy, 1);
  const ids = distinctSorted(replicas);
  if (ids.length === 0) throw new MergeError('no_replicas', 'no replicas to assign mergers to');
  const r = Math.min(redundancy, ids.length);
  // a seeded permutation breaks ties, so different rounds spread load differently
  const rank = seededRanks(ids.length, seed);
  const picker = new Picker(ids.length, rank);
  const out: string[][] = [];
  for (let p = 0; p < partitions; p++) {
    const chosen = picker.pick(r, []);
    out.push(chosen.map((i) => ids[i]));
  }
  return out;
}

/**
 * Repairs an assignment after replicas vanished. A merger is gone when it is
 * in `vanished` or not in `alive`. A partition that kept all its mergers is
 * returned unchanged; one that lost some (or all) keeps its survivors and is
 * topped up to its former merger count (at most the number of live replicas)
 * with the least-loaded live replicas, never a gone one. Returns a new
 * assignment; the input is not modified. Throws MergeError 'no_replicas' when
 * a partition needs a merger and no live replica is left.
 */
export function reassign(assignment: MergerAssignment, vanished: ReadonlySet<string>, alive: readonly string[]): string[][] {
  const live = distinctSorted(alive).filter((id) => !vanished.has(id));
  const index = new Map(live.map((id, i) => [id, i]));
  // loads and pair counts of the surviving part of the assignment
  const rank = live.map((_, i) => i);
  const picker = new Picker(live.length, rank);
  const kept: number[][] = assignment.map((mergers) => mergers.filter((id) => index.has(id)).map((id) => index.get(id)!));
  for (const k of kept) picker.count(k);
  return assignment.map((mergers, p) => {
    const survivors = kept[p];
    if (survivors.length === mergers.length) return [...mergers];
    if (live.length === 0) throw new MergeError('no_replicas', `partition ${p} lost its mergers and no replica is alive`);
    const target = Math.min(new Set(mergers).size, live.length);
    picker.rotate(p);
    const added = picker.pick(target - survivors.length, survivors);
    return [...survivors, ...added].map((i) => live[i]);
  });
}

/** How many partitions each replica merges. */
export function mergerLoads(assignment: MergerAssignment): Map<string, number> {
  const loads = new Map<string, number>();
  for (const mergers of assignment) for (const id of mergers) loads.set(id, (loads.get(id) ?? 0) + 1);
  return loads;
}

/** The partitions (by index) that `replica` merges. */
export function partitionsMergedBy(assignment: MergerAssignment, replica: string): number[] {
  const out: number[] = [];
  assignment.forEach((mergers, p) => {
    if (mergers.includes(replica)) out.push(p);
  });
  return out;
}

/** Greedy least-loaded picker with pair spreading; replicas are indices 0..R-1. */
class Picker {
  private readonly load: Int32Array;
  private readonly pairs: Int32Array;
  private offset = 0;

  constructor(
    private readonly size: number,
    private readonly rank: readonly number[],
  ) {
    this.load = new Int32Array(size);
    this.pairs = new Int32Array(size * size);
  }

  /** Records an existing group of mergers. */
  count(group: readonly number[]): void {
    for (const a of group) {
      this.load[a]++;
      for (const b of group) if (a !== b) this.pairs[a * this.size + b]++;
    }
  }

  /** Shifts the tie-break order (used by reassign to spread ties over partitions). */
  rotate(by: number): void {
    this.offset = by;
  }

  /**
   * Picks `k` replicas not in `already`, each time the one with the least
   * load, then the fewest partitions shared with the group so far, then the
   * lowest rank; records the grown group.
   */
  pick(k: number, already: readonly number[]): number[] {
    const n = this.size;
    const group = [...already];
    const added: number[] = [];
    for (let j = 0; j < k; j++) {
      let best = -1;
      let bestLoad = 0;
      let bestShared = 0;
      let bestRank = 0;
      for (let i = 0; i < n; i++) {
        if (group.includes(i)) continue;
        const load = this.load[i];
        let shared = 0;
        for (const g of group) shared += this.pairs[g * n + i];
        const rank = (((this.rank[i] - this.offset) % n) + n) % n;
        if (best < 0 || load < bestLoad || (load === bestLoad && (shared < bestShared || (shared === bestShared && rank < bestRank)))) {
          best = i;
          bestLoad = load;
          bestShared = shared;
          bestRank = rank;
        }
      }
      if (best < 0) break;
      group.push(best);
      added.push(best);
    }
    // record: loads of the new members, pairs between the new members and the whole group
    for (const a of added) {
      this.load[a]++;
      for (const b of group) {
        if (a === b) continue;
        this.pairs[a * n + b]++;
        if (!added.includes(b)) this.pairs[b * n + a]++;
      }
    }
    return added;
  }
}

function checkCount(name: string, value: number, min: number): void {
  if (!Number.isSafeInteger(value) || value < min) throw new MergeError('bad_argument', `${name} must be an integer >= ${min}, got ${value}`);
}

/** Sorted copy of `ids`; MergeError 'duplicate_replica' on a repeated id. */
function distinctSorted(ids: readonly string[]): string[] {
  const sorted = [...ids].sort();
  for (let i = 1; i < sorted.length; i++) {
    if (sorted[i] === sorted[i - 1]) throw new MergeError('duplicate_replica', `replica ${JSON.stringify(sorted[i])} is listed twice`);
  }
  return sorted;
}

/** rank[i] = position of replica i in a permutation seeded by `seed` (Fisher-Yates over mulberry32). */
function seededRanks(n: number, seed: number | string): number[] {
  let h = 0x811c9dc5;
  const text = typeof seed === 'number' ? `n:${seed}` : `s:${seed}`;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193) >>> 0;
  let a = h;
  const next = (): number => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const order = Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1));
    [order[i], order[j]] = [order[j], order[i]];
  }
  const rank = new Array<number>(n);
  order.forEach((replica, position) => (rank[replica] = position));
  return rank;
}
