// rebalance: keep the cuts, refill emptied stages, place newcomers where
// throughput is lowest, and move at most maxMoves miners already in place.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { gptConfig } from '../../src/model/config.ts';
import { totalFlops } from '../../src/planner/cost.ts';
import { PlanError } from '../../src/planner/errors.ts';
import { planPlacement } from '../../src/planner/placement.ts';
import { rebalance } from '../../src/planner/rebalance.ts';
import { Plan, type MinerCapacity } from '../../src/planner/types.ts';
import { parse } from '../../src/protocol/messages.ts';
import { minersOf } from './helpers.ts';

const tiny = gptConfig('gpt-tiny');
const GB = 1e9;
const miners = minersOf([40, 20, 10, 10, 5], GB);
// stages [0,2) [2,4) [4,6): m2+m3, m0, m1+m4 (see placement.test.ts)
const base = planPlacement({ config: tiny, miners, stages: 3, batchSize: 8, slots: 2 });

function assertSound(plan: Plan, present: MinerCapacity[]): void {
  const byId = new Map(present.map((m) => [m.id, m]));
  assert.deepEqual(plan.stages.map((s) => s.range), base.stages.map((s) => s.range), 'cuts kept');
  for (const s of plan.stages) {
    assert.ok(s.miners.length >= 1, 'no stage left empty');
    for (const id of s.miners) assert.ok(byId.get(id)!.memoryBytes >= s.memoryBytes);
  }
  assert.equal(plan.bottleneckTokensPerS, Math.min(...plan.stages.map((s) => s.throughputTokensPerS)));
  // the orchestrator stores the plan as JSON and validates it when it reads it back
  assert.deepEqual(parse(Plan, JSON.parse(JSON.stringify(plan)), 'plan', 'corrupt'), plan);
}

const existingMoves = (moves: { from: number | null }[]): number => moves.filter((m) => m.from !== null).length;

test('the only replica of a stage leaves: the stage is refilled, at most maxMoves miners move', () => {
  const left = miners.filter((m) => m.id !== 'm0');
  const { plan, moves, departed } = rebalance(base, left);
  assertSound(plan, left);
  assert.deepEqual(departed, ['m0']);
  assert.ok(existingMoves(moves) <= 2, JSON.stringify(moves));
  assert.ok(moves.some((m) => m.to === 1));
  // every move is real and consistent with the plan
  for (const m of moves) {
    assert.notEqual(m.from, m.to);
    if (m.to !== null) assert.ok(plan.stages[m.to].miners.includes(m.miner));
  }
});

test('with maxMoves 0 the emptied stage is still refilled, by one move', () => {
  const left = miners.filter((m) => m.id !== 'm0');
  const { plan, moves } = rebalance(base, left, { maxMoves: 0 });
  assertSound(plan, left);
  assert.equal(moves.length, 1);
  assert.equal(moves[0].to, 1);
});

test('a replica leaves a stage that keeps another: no forced move, at most maxMoves', () => {
  const left = miners.filter((m) => m.id !== 'm3');
  for (const maxMoves of [0, 1, 2, 3]) {
    const { plan, moves } = rebalance(base, left, { maxMoves });
    assertSound(plan, left);
    assert.ok(existingMoves(moves) <= maxMoves, `${maxMoves}: ${JSON.stringify(moves)}`);
    assert.ok(plan.bottleneckTokensPerS > 0);
  }
});

test('a join goes to the bottleneck stage', () => {
  const bottleneck = base.stages.findIndex((s) => s.throughputTokensPerS === base.bottleneckTokensPerS);
  assert.equal(bottleneck, 0);
  const joined = [...miners, { id: 'new', gflops: 15, memoryBytes: GB }];
  const { plan, moves, departed } = rebalance(base, joined);
  assertSound(plan, joined);
  assert.deepEqual(departed, []);
  assert.deepEqual(moves, [{ miner: 'new', from: null, to: 0 }]);
  assert.deepEqual(plan.stages[0].miners, ['m2', 'm3', 'new']);
  assert.ok(plan.bottleneckTokensPerS > base.bottleneckTokensPerS);
});

test('nothing changed: nothing moves', () => {
  const { plan, moves, departed } = rebalance(base, miners);
  assert.deepEqual(moves, []);
  assert.deepEqual(departed, []);
  assert.deepEqual(plan, base);
});

/** A hand-made plan: stages of equal cost, the given replicas and memory needs. */
function handPlan(replicas: string[][], memoryBytes: number[] = replicas.map(() => 1e6)): Plan {
  const flops = { forward: 1e6, backward: 2e6 };
  return {
    stages: replicas.map((ids, s) => ({
      range: { from: 3 * s, to: 3 * s + 3 },
      params: 1000,
      flopsPerToken: flops,
      memoryBytes: memoryBytes[s],
      miners: ids,
      throughputTokensPerS: 0,
    })),
    bottleneckTokensPerS: 0,
    unassigned: [],
  };
}

test('a voluntary move happens only if it raises the bottleneck by more than minGain', () => {
  const fleet: MinerCapacity[] = [
    { id: 'a', gflops: 40, memoryBytes: GB },
    { id: 'b', gflops: 20, memoryBytes: GB },
    { id: 'c', gflops: 5, memoryBytes: GB },
  ];
  const previous = handPlan([['a', 'b'], ['c']]);
  const { plan, moves } = rebalance(previous, fleet);
  // b moves to the starved stage: bottleneck 5 → 25 GFLOP/s worth
  assert.deepEqual(moves, [{ miner: 'b', from: 0, to: 1 }]);
  assert.ok(Math.abs(plan.bottleneckTokensPerS - (25e9 / totalFlops(previous.stages[0].flopsPerToken))) < 1e-6);
  assert.deepEqual(rebalance(previous, fleet, { minGain: 10 }).moves, []);
  assert.deepEqual(rebalance(previous, fleet, { maxMoves: 0 }).moves, []);
});

test('a stage that departures leave with one replica takes a second from a stage with three or more, gain or not', () => {
  const fleet: MinerCapacity[] = [
    { id: 'h1', gflops: 3, memoryBytes: GB },
    { id: 'h2', gflops: 4, memoryBytes: GB },
    { id: 'h3', gflops: 3, memoryBytes: GB },
    { id: 'h4', gflops: 3, memoryBytes: GB },
    { id: 'p', gflops: 12, memoryBytes: GB },
  ];
  const previous = handPlan([['h1', 'h2', 'h3', 'h4'], ['p', 'x', 'y', 'z']]);
  const { plan, moves, departed } = rebalance(previous, fleet);
  assert.deepEqual(departed, ['x', 'y', 'z']);
  // 13 against 12 GFLOP/s: no move would raise the bottleneck, yet p must not stay alone; the donor that keeps the
  // bottleneck highest is a 3-GFLOP/s one, h1 the first of them
  assert.deepEqual(moves, [{ miner: 'h1', from: 0, to: 1 }]);
  assert.deepEqual(plan.stages.map((s) => s.miners), [['h2', 'h3', 'h4'], ['p', 'h1']]);
  // a budget of no moves keeps it alone; a stage that was alone already is left alone; two replicas give none
  assert.deepEqual(rebalance(previous, fleet, { maxMoves: 0 }).moves, []);
  assert.deepEqual(rebalance(handPlan([['h1', 'h2', 'h3', 'h4'], ['p']]), fleet).moves, []);
  assert.deepEqual(rebalance(handPlan([['h1', 'h2'], ['p', 'x']]), fleet.filter((m) => m.id !== 'h3' && m.id !== 'h4')).moves, []);
});

test('a voluntary move never leaves a stage with one replica where the stage it joins had two or more', () => {
  // seen end to end (test/network/byzantine.test.ts): three cheaters evicted from stage 0, two voluntary moves
  // took both honest replicas of stage 1 to it, and the poisoner stayed alone there, merging with nobody
  const fleet: MinerCapacity[] = [
    { id: 'a1', gflops: 1, memoryBytes: GB },
    { id: 'a2', gflops: 1, memoryBytes: GB },
    { id: 'b1', gflops: 5, memoryBytes: GB },
    { id: 'b2', gflops: 5, memoryBytes: GB },
    { id: 'p', gflops: 10, memoryBytes: GB / 2 },
  ];
  // stage 0 needs more memory than p has
  const previous = handPlan([['a1', 'a2', 'x', 'y', 'z'], ['b1', 'b2', 'p']], [GB, GB / 4]);
  const { plan, moves } = rebalance(previous, fleet);
  // the first move raises the bottleneck 2 → 7; a second (7 → 10) would leave p alone, so it is not made
  assert.deepEqual(moves, [{ miner: 'b1', from: 1, to: 0 }]);
  assert.deepEqual(plan.stages.map((s) => s.miners), [['a1', 'a2', 'b1'], ['b2', 'p']]);
  // 2 + 1 may still become 1 + 2 (the move of the minGain test): no stage loses redundancy it had
  for (const maxMoves of [1, 2, 3, 4]) {
    for (const s of rebalance(previous, fleet, { maxMoves }).plan.stages) assert.ok(s.miners.length >= 2, `maxMoves ${maxMoves}`);
  }
});

test('a miner whose memory shrank below its stage leaves it', () => {
  const shrunk = miners.map((m) => (m.id === 'm1' ? { ...m, memoryBytes: 1e6 } : m));
  const { plan, moves } = rebalance(base, shrunk);
  assertSound(plan, shrunk);
  assert.ok(moves.some((m) => m.miner === 'm1' && m.from === 2 && m.to === null));
  assert.ok(plan.unassigned.includes('m1'));
});

test('a stage no remaining miner can hold is refused with the numbers', () => {
  const needs = base.stages[1].memoryBytes; // 31.6 MB
  const fleet = [
    { id: 'big', gflops: 10, memoryBytes: GB },
    ...minersOf([10, 10, 10], 25e6),
  ];
  const previous = planPlacement({ config: tiny, miners: fleet, stages: 3, batchSize: 8, slots: 2 });
  assert.deepEqual(previous.stages[1].miners, ['big']);
  assert.ok(needs > 25e6);
  assert.throws(
    () => rebalance(previous, fleet.slice(1)),
    (e: unknown) => e instanceof PlanError && /stage 1 \[2,4\) lost its last replica and needs 31\.6 MB/.test(e.message) && /largest miner: 25 MB/.test(e.message),
  );
});

test('a join that does not fit the bottleneck stage goes to the slowest stage it fits, or nowhere', () => {
  const fleet: MinerCapacity[] = [
    { id: 'a', gflops: 40, memoryBytes: GB },
    { id: 'c', gflops: 5, memoryBytes: GB },
  ];
  // stage 1 is the bottleneck and needs 50 MB
  const previous = handPlan([['a'], ['c']], [10e6, 50e6]);
  assert.deepEqual(rebalance(previous, [...fleet, { id: 'n', gflops: 15, memoryBytes: 60e6 }]).moves, [{ miner: 'n', from: null, to: 1 }]);
  const n = { id: 'n', gflops: 15, memoryBytes: 20e6 };
  const r = rebalance(previous, [...fleet, n], { minGain: 10 });
  assert.deepEqual(r.moves, [{ miner: 'n', from: null, to: 0 }]);
  assert.deepEqual(r.plan.stages.map((s) => s.miners), [['a', 'n'], ['c']]);
  // with the default 10% threshold, a and c also swap (two moves): the bottleneck goes from 5 to 20 GFLOP/s worth
  const swapped = rebalance(previous, [...fleet, n]);
  assert.deepEqual(swapped.moves, [{ miner: 'a', from: 0, to: 1 }, { miner: 'c', from: 1, to: 0 }, { miner: 'n', from: null, to: 0 }]);
  assert.deepEqual(swapped.plan.stages.map((s) => s.miners.sort()), [['c', 'n'], ['a']]);
  // with one move allowed, a alone moves (5 → 15 GFLOP/s worth)
  assert.deepEqual(rebalance(previous, [...fleet, n], { maxMoves: 1 }).moves, [{ miner: 'a', from: 0, to: 1 }, { miner: 'n', from: null, to: 0 }]);
  const none = rebalance(previous, [...fleet, { id: 'small', gflops: 99, memoryBytes: 1e6 }]);
  assert.deepEqual(none.moves, []);
  assert.deepEqual(none.plan.unassigned, ['small']);
});
