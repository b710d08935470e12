import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  assignMergers,
  checkPartitions,
  maxPartitions,
  mergerLoads,
  partitionVector,
  partitionsMergedBy,
  reassign,
  type MergerAssignment,
} from '../../src/merge/partition.ts';
import { expectMergeError } from './helpers.ts';

const GPT_TINY_PARAMS = 867_072;

test('partitions tile [0, n) exactly, block-aligned, nearly equal', () => {
  for (const [n, count, block] of [
    [GPT_TINY_PARAMS, 8, 256],
    [GPT_TINY_PARAMS, 37, 256],
    [1000, 3, 64],
    [1000, 16, 64], // 16 blocks, last one short
    [1, 1, 256],
    [257, 2, 256],
    [10_000, 7, 1],
  ] as const) {
    const parts = partitionVector(n, count, block);
    assert.equal(parts.length, count);
    checkPartitions(parts, n, block);
    let expected = 0;
    for (const [i, p] of parts.entries()) {
      assert.equal(p.index, i);
      assert.equal(p.start, expected);
      assert.equal(p.start % block, 0);
      assert.ok(p.end === n || p.end % block === 0, `[${p.start}, ${p.end}) not aligned`);
      assert.ok(p.end > p.start);
      expected = p.end;
    }
    assert.equal(expected, n);
    const blocks = parts.map((p) => Math.ceil((p.end - p.start) / block));
    assert.ok(Math.max(...blocks) - Math.min(...blocks) <= 1, `block counts ${blocks}`);
  }
});

test('partitionVector refuses more partitions than blocks and bad counts', () => {
  assert.equal(maxPartitions(1000, 256), 4);
  expectMergeError(() => partitionVector(1000, 5, 256), 'bad_argument');
  expectMergeError(() => partitionVector(0, 1, 256), 'bad_argument');
  expectMergeError(() => partitionVector(1000, 0, 256), 'bad_argument');
  expectMergeError(() => partitionVector(1000, 2, 0), 'bad_argument');
  expectMergeError(() => partitionVector(1000.5, 2, 8), 'bad_argument');
});

test('checkPartitions rejects gaps, overlaps, misalignment, short cover', () => {
  const ok = partitionVector(1024, 4, 64);
  checkPartitions(ok, 1024, 64);
  expectMergeError(() => checkPartitions([{ index: 0, start: 0, end: 100 }, { index: 1, start: 100, end: 1024 }], 1024, 64), 'misaligned');
  expectMergeError(() => checkPartitions([{ index: 0, start: 0, end: 512 }, { index: 1, start: 576, end: 1024 }], 1024, 64), 'bad_argument');
  expectMergeError(() => checkPartitions([{ index: 0, start: 0, end: 512 }], 1024, 64), 'bad_argument');
  expectMergeError(() => checkPartitions([{ index: 1, start: 0, end: 1024 }], 1024, 64), 'bad_argument');
  expectMergeError(() => checkPartitions([], 1024, 64), 'bad_argument');
});

function replicaIds(count: number): string[] {
  return Array.from({ length: count }, (_, i) => `0x${(i + 1).toString(16).padStart(40, '0')}`);
}

function assertValid(assignment: MergerAssignment, partitions: number, replicas: readonly string[], redundancy: number): void {
  assert.equal(assignment.length, partitions);
  const want = Math.min(redundancy, replicas.length);
  for (const [p, mergers] of assignment.entries()) {
    assert.equal(mergers.length, want, `partition ${p}: ${mergers}`);
    assert.equal(new Set(mergers).size, mergers.length, `partition ${p} has a repeated merger: ${mergers}`);
    for (const m of mergers) assert.ok(replicas.includes(m), `partition ${p}: unknown merger ${m}`);
  }
}

test('assignMergers: distinct mergers per partition, balanced loads, spread pairs', () => {
  for (const R of [1, 2, 3, 4, 5, 7, 8, 16]) {
    for (const P of [1, 3, 8, 16, 33, 64]) {
      const replicas = replicaIds(R);
      const a = assignMergers(P, replicas, 2, 'round-7');
      assertValid(a, P, replicas, 2);
      const loads = replicas.map((id) => mergerLoads(a).get(id) ?? 0);
      const r = Math.min(2, R);
      assert.equal(loads.reduce((s, x) => s + x, 0), P * r);
      assert.ok(Math.max(...loads) - Math.min(...loads) <= 1, `R=${R} P=${P} loads ${loads}`);
      assert.ok(Math.max(...loads) <= Math.ceil((P * r) / R));
      if (R >= 3) {
        // pairs are spread: no pair shares more than ceil(P / C(R, 2)) + 1 partitions
        const pairs = new Map<string, number>();
        for (const [x, y] of a) pairs.set([x, y].sort().join(), (pairs.get([x, y].sort().join()) ?? 0) + 1);
        const bound = Math.ceil(P / ((R * (R - 1)) / 2)) + 1;
        assert.ok(Math.max(...pairs.values()) <= bound, `R=${R} P=${P}: a pair shares ${Math.max(...pairs.values())} partitions, bound ${bound}`);
      }
    }
  }
});

test('assignMergers: redundancy 3, deterministic, independent of replica order, seed matters', () => {
  const replicas = replicaIds(6);
  const a = assignMergers(20, replicas, 3, 42);
  assertValid(a, 20, replicas, 3);
  assert.deepEqual(assignMergers(20, [...replicas].reverse(), 3, 42), a);
  assert.deepEqual(assignMergers(20, replicas, 3, 42), a);
  const seeds = new Set([1, 2, 3, 4, 5].map((s) => JSON.stringify(assignMergers(20, replicas, 3, s))));
  assert.ok(seeds.size > 1, 'different seeds should give different assignments');
  assert.deepEqual(partitionsMergedBy(a, replicas[0]), a.flatMap((m, p) => (m.includes(replicas[0]) ? [p] : [])));
});

test('assignMergers refuses bad input', () => {
  expectMergeError(() => assignMergers(4, []), 'no_replicas');
  expectMergeError(() => assignMergers(4, ['a', 'b', 'a']), 'duplicate_replica');
  expectMergeError(() => assignMergers(0, ['a']), 'bad_argument');
  expectMergeError(() => assignMergers(4, ['a'], 0), 'bad_argument');
});

test('reassign after every single and double vanish: full cover, no gone merger, untouched partitions kept', () => {
  for (const R of [2, 3, 4, 5, 8]) {
    const replicas = replicaIds(R);
    const P = 16;
    const a = assignMergers(P, replicas, 2, 9);
    const cases: string[][] = [];
    for (let i = 0; i < R; i++) {
      cases.push([replicas[i]]);
      for (let j = i + 1; j < R; j++) cases.push([replicas[i], replicas[j]]);
    }
    for (const gone of cases) {
      const vanished = new Set(gone);
      const alive = replicas.filter((id) => !vanished.has(id));
      if (alive.length === 0) {
        expectMergeError(() => reassign(a, vanished, alive), 'no_replicas');
        continue;
      }
      const b = reassign(a, vanished, alive);
      assertValid(b, P, alive, 2);
      for (let p = 0; p < P; p++) {
        for (const m of b[p]) assert.ok(!vanished.has(m), `partition ${p} given to vanished ${m}`);
        if (!a[p].some((m) => vanished.has(m))) assert.deepEqual(b[p], a[p], `partition ${p} was touched`);
        else for (const m of a[p]) if (!vanished.has(m)) assert.ok(b[p].includes(m), `partition ${p} dropped survivor ${m}`);
      }
      // the repaired partitions go to the least loaded: loads stay within 2 of each other
      const loads = alive.map((id) => mergerLoads(b).get(id) ?? 0);
      assert.ok(Math.max(...loads) - Math.min(...loads) <= 2, `R=${R} gone=${gone.length} loads ${loads}`);
    }
  }
});

test('reassign: a replica missing from alive counts as gone; a new replica takes orphaned work; input untouched', () => {
  const replicas = ['a', 'b', 'c', 'd'];
  const a = assignMergers(8, replicas, 2, 1);
  const frozen = JSON.stringify(a);
  const b = reassign(a, new Set(['a']), ['b', 'c', 'e']); // d silently gone, e joined
  assert.equal(JSON.stringify(a), frozen);
  for (const mergers of b) {
    assert.equal(mergers.length, 2);
    for (const m of mergers) assert.ok(['b', 'c', 'e'].includes(m));
  }
  assert.ok((mergerLoads(b).get('e') ?? 0) >= 3, 'the new replica should take a fair share of the orphaned partitions');
  // a single survivor: every partition gets it (redundancy capped by the live count)
  const c = reassign(a, new Set(['a', 'b', 'c']), ['d']);
  for (const mergers of c) assert.deepEqual(mergers, ['d']);
  expectMergeError(() => reassign(a, new Set(['a']), ['b', 'b']), 'duplicate_replica');
});
